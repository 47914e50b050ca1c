package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Ordering says which records may run at the same time.
type Ordering uint8

const (
	// KeyOrder (the default) runs records of the same key in one partition
	// one at a time, in offset order; different keys run in parallel. Records
	// with a nil key have no key to order by and run as in Unordered.
	KeyOrder Ordering = iota
	// PartitionOrder runs the records of a partition one at a time, in offset
	// order.
	PartitionOrder
	// Unordered runs any record on any free worker; nothing about order is
	// promised. Commits still follow the contiguous completed prefix.
	Unordered
)

func (o Ordering) String() string {
	switch o {
	case KeyOrder:
		return "key"
	case PartitionOrder:
		return "partition"
	case Unordered:
		return "unordered"
	}
	return fmt.Sprintf("Ordering(%d)", uint8(o))
}

// Policy says what happens to a record whose handler keeps failing. Build one
// with Block, DeadLetter or Skip.
type Policy struct {
	kind     policyKind
	attempts int
	topic    string
	writer   DeadLetterWriter
}

type policyKind uint8

const (
	policyBlock policyKind = iota
	policyDeadLetter
	policySkip
)

// Block retries a failing record forever with backoff. Its key (or
// partition, or nothing in Unordered mode) waits, the commit does not pass
// it, and nothing is skipped. It is the default.
func Block() Policy { return Policy{kind: policyBlock} }

// DeadLetter writes a record to topic after attempts failed attempts and then
// marks it complete — only once the write is acknowledged; a failing write is
// retried with backoff and holds the record like Block. The dead-letter
// record keeps the original key, value and headers and adds
// tidemark-error, tidemark-attempts, tidemark-origin-topic,
// tidemark-origin-partition and tidemark-origin-offset. w may be nil when
// the Source implements DeadLetterWriter.
func DeadLetter(topic string, attempts int, w DeadLetterWriter) Policy {
	return Policy{kind: policyDeadLetter, topic: topic, attempts: attempts, writer: w}
}

// Skip marks a record complete after attempts failed attempts, logs it at
// error level with its last error and counts it in tidemark.records.skipped.
// Use it only when losing the record's effect is acceptable.
func Skip(attempts int) Policy { return Policy{kind: policySkip, attempts: attempts} }

type config struct {
	handlers       map[string]*route
	unrouted       *route // the route of records of an unregistered topic
	ordering       Ordering
	orderSet       bool // Order was given (settle.go)
	concurrency    int
	highRecords    int
	lowRecords     int
	highBytes      int64
	lowBytes       int64
	maxBytes       int64
	commitInterval time.Duration
	commitTimeout  time.Duration
	drainBudget    time.Duration
	handlerTimeout time.Duration
	backoffInitial time.Duration
	backoffMax     time.Duration
	policy         Policy
	classify       Classifier
	logger         *slog.Logger
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	errs           []error
	assignHook     AssignHook
	minRecordBytes int
	maxCompression float64
	window         int  // 0: 2 * highRecords
	batched        bool // a topic is registered with HandleBatch (set by resolve)
}

// Option configures a Runner.
type Option func(*config)

// Order sets the ordering mode. Default KeyOrder.
func Order(o Ordering) Option { return func(c *config) { c.ordering, c.orderSet = o, true } }

// Concurrency sets the number of handlers that may run at once across all
// partitions (the size of the worker pool). Default 64.
func Concurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WaterMarks sets the per-partition flow control in records. A partition's
// buffered plus in-flight records never exceed high: the runner limits each
// poll to the room left under high, and pauses a partition once its room is
// below half the gap between the marks (so one full partition does not
// shrink every poll); it resumes it when they fall to low. Defaults 10,000
// and 5,000: a pause makes franz-go drop what it had already fetched for the
// partition, so marks far below a fetch's worth of records cost throughput
// (docs/performance.md has the measurements).
func WaterMarks(high, low int) Option {
	return func(c *config) { c.highRecords, c.lowRecords = high, low }
}

// ByteWaterMarks is WaterMarks in bytes: what the partition's buffered and
// in-flight records are charged, their key, value and header bytes as
// allocated plus RecordOverhead each. A poll can overshoot the high mark by
// the bytes it brings. Defaults 16 MiB and 8 MiB.
func ByteWaterMarks(high, low int64) Option {
	return func(c *config) { c.highBytes, c.lowBytes = high, low }
}

// Window sets each partition's uncommitted window: the most records it may
// have delivered and not yet behind its safe offset — buffered, in flight,
// or finished behind an older record that has not (a record retried
// forever under Block, or fenced, holds the commit while the records after
// it finish). A partition is paused when the next poll could pass its
// window, and resumed once the window is down by the gap between the water
// marks: behind one stuck record the other keys go on until the window is
// full, then the partition waits, and memory stays flat. Stats and the
// tidemark.partition.uncommitted gauge show it; a partition paused with a
// full window is logged, with the oldest unfinished record and why it has
// not finished. It must be at least the high water mark. Default twice the
// high water mark.
func Window(records int) Option { return func(c *config) { c.window = records } }

// MaxBufferedBytes caps what the consumer holds for records: its source's
// share (SourceShare of it, see FetchLimits) and the runner's charge for
// the records it buffers and runs (key, value and header bytes as allocated
// plus RecordOverhead each, and the partitions' tracker rings beyond their
// least size). The runner pauses every partition once its charge reaches
// its own share less what one hand-over from the source can add (so that
// it stays within its share after it), and resumes them at half of that:
// docs/runner.md has the formula. New fails if that leaves no room.
// PartitionOverhead per owned partition comes on top. Default 256 MiB.
func MaxBufferedBytes(n int64) Option { return func(c *config) { c.maxBytes = n } }

// RecordShape states what the memory bound (MaxBufferedBytes) assumes of
// the records: none smaller than minBytes uncompressed (key, value, headers
// and about 10 bytes of framing), and no batch compressed more than
// maxCompression times (1 for none). A source sizes its fetches from them,
// because a client decodes a whole fetch at once: a fetch of tiny,
// well-compressed records decodes to many times its size on the wire
// (docs/runner.md has the formula). Records smaller, or compressed more,
// than stated let the client's share exceed its budget in proportion.
// Defaults 64 bytes and 4.
func RecordShape(minBytes int, maxCompression float64) Option {
	return func(c *config) { c.minRecordBytes, c.maxCompression = minBytes, maxCompression }
}

// CommitInterval sets how often the safe offsets of owned partitions are
// committed asynchronously. Default 1s.
func CommitInterval(d time.Duration) Option { return func(c *config) { c.commitInterval = d } }

// CommitTimeout bounds one commit request. Default 10s.
func CommitTimeout(d time.Duration) Option { return func(c *config) { c.commitTimeout = d } }

// DrainBudget bounds how long a revoke waits for the in-flight handlers of
// the revoked partitions before its final commit, and how long a shutdown
// started by the end of Run's ctx waits. It must be well under the group's
// rebalance timeout. Default 10s.
func DrainBudget(d time.Duration) Option { return func(c *config) { c.drainBudget = d } }

// HandlerTimeout bounds each handler attempt; an attempt that runs past it
// has its ctx cancelled and counts as failed. Default 0: no timeout.
func HandlerTimeout(d time.Duration) Option { return func(c *config) { c.handlerTimeout = d } }

// Backoff sets the wait before each retry of a failed handler attempt, a
// failed dead-letter write or a failed assign hook: before attempt n+1 it
// is d, initial doubled n-1 times and at most max, with equal jitter: the
// wait is drawn uniformly from [d/2, d]. New rejects initial <= 0 and max <
// initial. Defaults 100ms and 10s.
func Backoff(initial, max time.Duration) Option {
	return func(c *config) { c.backoffInitial, c.backoffMax = initial, max }
}

// Failure sets the failure policy. Default Block(). WithPolicy overrides
// it for one topic.
func Failure(p Policy) Option { return func(c *config) { c.policy = p } }

// Classify sets the classifier that tells each failed attempt's ErrorKind
// (WithClassifier overrides it for one topic). Default KindOf: errors
// marked with Permanent or Transient are of that kind, all others
// Retryable.
func Classify(f Classifier) Option { return func(c *config) { c.classify = f } }

// Logger sets the structured logger. Default slog.Default().
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// MeterProvider sets the OpenTelemetry meter provider. Default the global one.
func MeterProvider(p metric.MeterProvider) Option { return func(c *config) { c.meterProvider = p } }

// TracerProvider sets the OpenTelemetry tracer provider. Default the global
// one, followed as it changes: an SDK installed after New traces the next
// record. Trace context comes from record headers through the global
// propagator (otel.SetTextMapPropagator); none is installed by default.
func TracerProvider(p trace.TracerProvider) Option { return func(c *config) { c.tracerProvider = p } }

// OnAssign sets a hook run for each assignment report, with all of its
// partitions, before their records run (see AssignHook). pkg/inbox uses it to bump the partition's lease and to
// skip records already applied. Default none.
func OnAssign(h AssignHook) Option { return func(c *config) { c.assignHook = h } }

// ConfigError is returned by New for an invalid option; Option names it.
type ConfigError struct {
	Option string
	Reason string
}

func (e *ConfigError) Error() string { return "runner: option " + e.Option + ": " + e.Reason }

func defaults() config {
	return config{
		handlers:       map[string]*route{},
		ordering:       KeyOrder,
		concurrency:    64,
		highRecords:    10000,
		lowRecords:     5000,
		highBytes:      16 << 20,
		lowBytes:       8 << 20,
		maxBytes:       256 << 20,
		commitInterval: time.Second,
		commitTimeout:  10 * time.Second,
		drainBudget:    10 * time.Second,
		backoffInitial: 100 * time.Millisecond,
		backoffMax:     10 * time.Second,
		policy:         Block(),
		minRecordBytes: 64,
		maxCompression: 4,
	}
}

func (c *config) validate() error {
	if len(c.errs) > 0 {
		return &ConfigError{Option: "Handle", Reason: errors.Join(c.errs...).Error()}
	}
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: opt, Reason: fmt.Sprintf(format, a...)}
	}
	switch {
	case len(c.handlers) == 0:
		return bad("Handle", "no topic registered")
	case c.ordering > Unordered:
		return bad("Order", "unknown ordering %d", c.ordering)
	case c.concurrency < 1:
		return bad("Concurrency", "%d is not positive", c.concurrency)
	case c.highRecords < 1 || c.lowRecords < 0 || c.lowRecords >= c.highRecords:
		return bad("WaterMarks", "need 0 <= low < high and high >= 1, got high %d low %d", c.highRecords, c.lowRecords)
	case c.highBytes < 1 || c.lowBytes < 0 || c.lowBytes >= c.highBytes:
		return bad("ByteWaterMarks", "need 0 <= low < high and high >= 1, got high %d low %d", c.highBytes, c.lowBytes)
	case c.window != 0 && c.window < c.highRecords:
		return bad("Window", "%d is below the high water mark %d", c.window, c.highRecords)
	case c.maxBytes < c.highBytes:
		return bad("MaxBufferedBytes", "%d is below the byte high water mark %d", c.maxBytes, c.highBytes)
	case c.commitInterval <= 0:
		return bad("CommitInterval", "%v is not positive", c.commitInterval)
	case c.commitTimeout <= 0:
		return bad("CommitTimeout", "%v is not positive", c.commitTimeout)
	case c.drainBudget <= 0:
		return bad("DrainBudget", "%v is not positive", c.drainBudget)
	case c.handlerTimeout < 0:
		return bad("HandlerTimeout", "%v is negative", c.handlerTimeout)
	case c.backoffInitial <= 0 || c.backoffMax < c.backoffInitial:
		return bad("Backoff", "need 0 < initial <= max, got %v and %v", c.backoffInitial, c.backoffMax)
	case c.policy.kind != policyBlock && c.policy.attempts < 1:
		return bad("Failure", "attempts %d is not positive", c.policy.attempts)
	case c.policy.kind == policyDeadLetter && c.policy.topic == "":
		return bad("Failure", "DeadLetter needs a topic")
	case c.policy.kind == policyDeadLetter && c.handlers[c.policy.topic] != nil:
		return bad("Failure", "dead-letter topic %q is also consumed", c.policy.topic)
	case c.logger == nil:
		return bad("Logger", "nil logger")
	case c.minRecordBytes < 1 || c.maxCompression < 1:
		return bad("RecordShape", "need minBytes >= 1 and maxCompression >= 1, got %d and %g", c.minRecordBytes, c.maxCompression)
	}
	if c.classify == nil {
		c.classify = KindOf
	}
	for _, rt := range c.routes() {
		if err := c.resolve(rt); err != nil {
			return err
		}
	}
	c.unrouted = c.noHandler()
	if c.window == 0 {
		c.window = 2 * c.highRecords
	}
	if pauseAt, handover := c.globalLimits(); pauseAt < 1 {
		return bad("MaxBufferedBytes", "%d leaves the runner no room: its source takes %g of it and one hand-over can add %d bytes (raise it, or narrow the WaterMarks' gap)",
			c.maxBytes, SourceShare, handover)
	}
	return nil
}

// SourceShare is the part of MaxBufferedBytes the runner leaves to its
// source (FetchLimits.Bytes): the client's fetch buffers and the adapter's
// records taken ahead. The runner's own buffers and in-flight records use
// the rest.
const SourceShare = 0.25

func (c *config) fetchLimits() FetchLimits {
	return FetchLimits{
		Bytes:          int64(float64(c.maxBytes) * SourceShare),
		PartitionBytes: c.highBytes - c.lowBytes,
		MinRecordBytes: c.minRecordBytes,
		MaxCompression: c.maxCompression,
	}
}
