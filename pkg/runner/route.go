package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// route is one registered topic: its handler and the settings its records
// run with. New fills in what the Handle options left unset from the
// runner-wide options, so a worker reads one route and nothing else.
type route struct {
	topic   string
	handler Handler

	policy         Policy
	policySet      bool
	backoffInitial time.Duration
	backoffMax     time.Duration
	backoffSet     bool
	timeout        time.Duration
	timeoutSet     bool
	timeoutCause   *timeoutCause // the cause of its attempts' deadlines
	classify       Classifier
	dlw            DeadLetterWriter // the DeadLetter policy's writer, or the source

	// A HandleBatch route's (batch.go); batch is nil for Handle's.
	batch        BatchHandler
	batchSize    int
	batchWait    time.Duration
	batchSizeSet bool
	batchWaitSet bool
	// extra is what each of its records is charged on top of
	// RecordOverhead: batchRecordOverhead for a batch route, else 0.
	extra int64
}

// HandleOption configures one topic registered with Handle, overriding the
// runner-wide option of the same concern for that topic's records.
type HandleOption func(*route)

// WithPolicy sets the topic's failure policy (runner-wide: Failure). A
// DeadLetter policy given here sends the topic's dead letters to its own
// topic.
func WithPolicy(p Policy) HandleOption {
	return func(r *route) { r.policy, r.policySet = p, true }
}

// WithBackoff sets the topic's retry backoff (runner-wide: Backoff, whose
// rules it follows).
func WithBackoff(initial, max time.Duration) HandleOption {
	return func(r *route) { r.backoffInitial, r.backoffMax, r.backoffSet = initial, max, true }
}

// WithTimeout bounds each handler attempt of the topic's records
// (runner-wide: HandlerTimeout); 0 means none.
func WithTimeout(d time.Duration) HandleOption {
	return func(r *route) { r.timeout, r.timeoutSet = d, true }
}

// WithClassifier sets the topic's error classifier (runner-wide: Classify).
func WithClassifier(c Classifier) HandleOption {
	return func(r *route) { r.classify = c }
}

// Handle registers h for the records of topic, with opts overriding the
// runner-wide options for them. At least one topic must be registered;
// registering a topic twice is an error from New.
func Handle(topic string, h Handler, opts ...HandleOption) Option {
	return func(c *config) {
		switch {
		case topic == "":
			c.errs = append(c.errs, errors.New("Handle: empty topic"))
		case h == nil:
			c.errs = append(c.errs, fmt.Errorf("Handle(%q): nil handler", topic))
		case c.handlers[topic] != nil:
			c.errs = append(c.errs, fmt.Errorf("Handle(%q): topic registered twice", topic))
		default:
			rt := &route{topic: topic, handler: h}
			for _, o := range opts {
				if o != nil {
					o(rt)
				}
			}
			c.handlers[topic] = rt
		}
	}
}

// resolve fills in rt's unset settings from the runner-wide ones and checks
// what it was given; the error names the topic and the option.
func (c *config) resolve(rt *route) error {
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: "Handle(" + strconv.Quote(rt.topic) + ")." + opt, Reason: fmt.Sprintf(format, a...)}
	}
	if !rt.policySet {
		rt.policy = c.policy
	}
	if !rt.backoffSet {
		rt.backoffInitial, rt.backoffMax = c.backoffInitial, c.backoffMax
	}
	if !rt.timeoutSet {
		rt.timeout = c.handlerTimeout
	}
	if rt.classify == nil {
		rt.classify = c.classify
	}
	rt.timeoutCause = &timeoutCause{d: rt.timeout}
	if rt.batch != nil {
		c.batched = true
		rt.extra = batchRecordOverhead
	}
	switch p := rt.policy; {
	case rt.backoffInitial <= 0 || rt.backoffMax < rt.backoffInitial:
		return bad("WithBackoff", "need 0 < initial <= max, got %v and %v", rt.backoffInitial, rt.backoffMax)
	case rt.timeout < 0:
		return bad("WithTimeout", "%v is negative", rt.timeout)
	case rt.batch == nil && rt.batchSizeSet:
		return bad("BatchSize", "is an option of HandleBatch, not Handle")
	case rt.batch == nil && rt.batchWaitSet:
		return bad("BatchWait", "is an option of HandleBatch, not Handle")
	case rt.batch != nil && (rt.batchSize < 1 || rt.batchSize > c.highRecords):
		return bad("BatchSize", "need 1 <= n <= the high water mark %d (a partition never holds more records), got %d", c.highRecords, rt.batchSize)
	case rt.batch != nil && rt.batchWait < 0:
		return bad("BatchWait", "%v is negative", rt.batchWait)
	case !rt.policySet:
		// The runner-wide policy is checked as Failure.
	case p.kind != policyBlock && p.attempts < 1:
		return bad("WithPolicy", "attempts %d is not positive", p.attempts)
	case p.kind == policyDeadLetter && p.topic == "":
		return bad("WithPolicy", "DeadLetter needs a topic")
	case p.kind == policyDeadLetter && c.handlers[p.topic] != nil:
		return bad("WithPolicy", "dead-letter topic %q is also consumed", p.topic)
	}
	return nil
}

// noHandler is the route of records of a topic nobody registered (a
// source must not deliver them): they fail loudly through the runner-wide
// policy rather than being skipped silently.
func (c *config) noHandler() *route {
	return &route{
		handler: func(_ context.Context, rec Record) error {
			return fmt.Errorf("runner: no handler registered for topic %q (record %s)", rec.Topic, rec.String())
		},
		policy: c.policy, backoffInitial: c.backoffInitial, backoffMax: c.backoffMax,
		timeout: c.handlerTimeout, classify: c.classify, timeoutCause: &timeoutCause{d: c.handlerTimeout},
	}
}

// deadLetterWriters gives every route under a DeadLetter policy its writer:
// the policy's own, or the source when it writes dead letters.
func (c *config) deadLetterWriters(src Source) error {
	for _, rt := range append(c.routes(), c.unrouted) {
		if rt.policy.kind != policyDeadLetter {
			continue
		}
		rt.dlw = rt.policy.writer
		if rt.dlw != nil {
			continue
		}
		w, ok := src.(DeadLetterWriter)
		if !ok {
			opt := "Failure"
			if rt.policySet {
				opt = "Handle(" + strconv.Quote(rt.topic) + ").WithPolicy"
			}
			return &ConfigError{Option: opt, Reason: "DeadLetter has no writer and the source does not implement DeadLetterWriter"}
		}
		rt.dlw = w
	}
	return nil
}

// routes returns the registered routes in topic order.
func (c *config) routes() []*route {
	rts := make([]*route, 0, len(c.handlers))
	for _, rt := range c.handlers {
		rts = append(rts, rt)
	}
	slices.SortFunc(rts, func(a, b *route) int { return strings.Compare(a.topic, b.topic) })
	return rts
}

// deadline returns ctx with the route's per-attempt timeout (which must be
// set), its deadline's cause the route's own.
func (rt *route) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, rt.timeout, rt.timeoutCause)
}

// timedOut returns err as a *TimeoutError naming rec when the route's
// deadline on ctx (see deadline) is what ended the attempt, as the Timeout
// middleware does; err itself otherwise.
func (rt *route) timedOut(ctx context.Context, rec *Record, err error) error {
	if err != nil && context.Cause(ctx) == error(rt.timeoutCause) {
		return &TimeoutError{Record: rec.String(), Timeout: rt.timeout, Err: err}
	}
	return err
}
