package runner

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

const instrumentation = "github.com/tidemark/tidemark/pkg/runner"

// telemetry holds the runner's OpenTelemetry instruments. Counters are
// added to from workers and the poll goroutine (the instruments are safe for
// concurrent use); gauges read the stats snapshot the poll goroutine
// publishes every commit interval.
type telemetry struct {
	handledC, failedC           metric.Int64Counter
	retried, deadLettered       metric.Int64Counter
	skipped, stale, lost        metric.Int64Counter
	revokes, pauses, outOfOrder metric.Int64Counter
	commitFailures, windowFull  metric.Int64Counter
	replaySkipped, fenced       metric.Int64Counter
	redelivered                 metric.Int64Counter
	deliveries                  metric.Int64Histogram
	batchSize                   metric.Int64Histogram
	duration, commitLatency     metric.Float64Histogram
	topicAttrs                  map[string]topicOpts
	reg                         metric.Registration
}

// topicOpts are one topic's measurement options, built once: passing a
// prebuilt slice keeps the per-record Add and Record calls allocation-free.
type topicOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newTelemetry(mp metric.MeterProvider, r *Runner) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation)
	t := &telemetry{topicAttrs: map[string]topicOpts{}}
	for topic := range r.cfg.handlers {
		a := metric.WithAttributeSet(attribute.NewSet(attribute.String("messaging.destination.name", topic)))
		t.topicAttrs[topic] = topicOpts{add: []metric.AddOption{a}, rec: []metric.RecordOption{a}}
	}
	var err error
	counter := func(name, desc string) metric.Int64Counter {
		c, e := m.Int64Counter(name, metric.WithDescription(desc))
		if e != nil && err == nil {
			err = e
		}
		return c
	}
	t.handledC = counter("tidemark.records.handled", "Records whose handler succeeded.")
	t.failedC = counter("tidemark.records.failed", "Failed handler attempts (errors and panics).")
	t.retried = counter("tidemark.records.retried", "Handler attempts retried after a failure.")
	t.deadLettered = counter("tidemark.records.dead_lettered", "Records written to the dead-letter topic.")
	t.skipped = counter("tidemark.records.skipped", "Records skipped by the Skip policy.")
	t.stale = counter("tidemark.completions.stale", "Completions from an old assignment or for a partition not owned, dropped.")
	t.lost = counter("tidemark.partitions.lost", "Partitions lost (nothing committed for them afterwards).")
	t.revokes = counter("tidemark.revokes", "Revokes drained.")
	t.pauses = counter("tidemark.partitions.pauses", "Times a partition was paused by flow control.")
	t.outOfOrder = counter("tidemark.records.out_of_order", "Records delivered again or out of order, dropped.")
	t.replaySkipped = counter("tidemark.records.replay_skipped", "Records completed without running the handler because they were already applied.")
	t.fenced = counter("tidemark.records.fenced", "Handler attempts fenced by a newer owner of the partition.")
	t.commitFailures = counter("tidemark.commit.failures", "Commit requests that failed or had an unknown outcome.")
	t.windowFull = counter("tidemark.partitions.window_pauses", "Times a partition was paused with its uncommitted window full behind an unfinished record.")
	t.redelivered = counter("tidemark.records.redelivered", "Records the runner took that the broker had delivered before (delivery count above 1; share groups).")
	if err != nil {
		return nil, err
	}
	t.deliveries, err = m.Int64Histogram("tidemark.record.delivery_count",
		metric.WithDescription("The broker's delivery count of each record the runner took, from sources that count deliveries (share groups): 1 on a first delivery."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	if err != nil {
		return nil, err
	}
	t.duration, err = m.Float64Histogram("tidemark.handler.duration", metric.WithUnit("s"), metric.WithDescription("Time from a record's first attempt to its success."))
	if err != nil {
		return nil, err
	}
	t.commitLatency, err = m.Float64Histogram("tidemark.commit.duration", metric.WithUnit("s"), metric.WithDescription("Commit request latency."))
	if err != nil {
		return nil, err
	}
	t.batchSize, err = m.Int64Histogram("tidemark.batch.size", metric.WithUnit("{record}"),
		metric.WithDescription("Records in each batch handed to a batch handler (HandleBatch)."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	if err != nil {
		return nil, err
	}
	gauge := func(name, desc string, opts ...metric.Int64ObservableGaugeOption) metric.Int64ObservableGauge {
		g, e := m.Int64ObservableGauge(name, append(opts, metric.WithDescription(desc))...)
		if e != nil && err == nil {
			err = e
		}
		return g
	}
	inflight := gauge("tidemark.records.in_flight", "Records whose handler is running.")
	buffered := gauge("tidemark.records.buffered", "Records fetched and not finished (buffered plus in flight).")
	charged := gauge("tidemark.records.bytes", "What the runner charges against MaxBufferedBytes: its records' key, value and header bytes as allocated plus RecordOverhead each, and the partitions' tracker rings beyond their least size.", metric.WithUnit("By"))
	paused := gauge("tidemark.partitions.paused", "Partitions paused by flow control.")
	windowFull := gauge("tidemark.partitions.window_full", "Partitions paused with their uncommitted window full.")
	owned := gauge("tidemark.partitions.owned", "Partitions assigned to this member.")
	uncommitted := gauge("tidemark.partition.uncommitted", "Records delivered and not yet behind the safe offset (the uncommitted window), per partition.")
	lag := gauge("tidemark.consumer.lag", "High watermark minus the acknowledged committed offset, per partition.")
	oldest, e := m.Float64ObservableGauge("tidemark.record.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished record, per partition; tidemark.record.state says why it has not finished (queued, running, retrying, fenced)."))
	if e != nil && err == nil {
		err = e
	}
	if err != nil {
		return nil, err
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		// Read the snapshot in place: copying it (Stats) would allocate
		// O(partitions) per collection.
		r.stats.mu.Lock()
		defer r.stats.mu.Unlock()
		s := &r.stats.s
		o.ObserveInt64(inflight, int64(s.InFlight))
		o.ObserveInt64(buffered, int64(s.Buffered))
		o.ObserveInt64(charged, s.Bytes)
		o.ObserveInt64(owned, int64(len(s.Partitions)))
		var np, nw int64
		for i := range s.Partitions {
			p := &s.Partitions[i]
			part := metric.WithAttributes(
				attribute.String("messaging.destination.name", p.TP.Topic),
				attribute.Int("messaging.destination.partition.id", int(p.TP.Partition)))
			if p.Paused {
				np++
			}
			if p.WindowFull {
				nw++
			}
			o.ObserveFloat64(oldest, p.OldestAge.Seconds(), metric.WithAttributes(
				attribute.String("messaging.destination.name", p.TP.Topic),
				attribute.Int("messaging.destination.partition.id", int(p.TP.Partition)),
				attribute.String("tidemark.record.state", p.OldestState.String())))
			o.ObserveInt64(uncommitted, int64(p.Outstanding), part)
			if p.HighWatermark >= 0 && p.Acknowledged >= 0 {
				o.ObserveInt64(lag, max(p.HighWatermark-p.Acknowledged, 0), part)
			}
		}
		o.ObserveInt64(paused, np)
		o.ObserveInt64(windowFull, nw)
		return nil
	}, inflight, buffered, charged, paused, windowFull, owned, uncommitted, oldest, lag)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (t *telemetry) unregister() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// handled counts a handled record and, when timed, records the time since
// start.
func (t *telemetry) handled(ctx context.Context, topic string, timed bool, start time.Time) {
	a := t.topicAttrs[topic] // zero (no attributes) for an unregistered topic
	t.handledC.Add(ctx, 1, a.add...)
	if timed {
		t.duration.Record(ctx, time.Since(start).Seconds(), a.rec...)
	}
}

func (t *telemetry) failed(ctx context.Context, topic string) {
	t.failedC.Add(ctx, 1, t.topicAttrs[topic].add...)
}

// delivered records the delivery count n of a record of topic the runner
// took, from a source that counts deliveries (n > 0), and counts it as
// redelivered when n > 1. With no meter provider installed both are no-ops
// that allocate nothing.
func (t *telemetry) delivered(topic string, n int32) {
	a := t.topicAttrs[topic]
	t.deliveries.Record(context.Background(), int64(n), a.rec...)
	if n > 1 {
		t.redelivered.Add(context.Background(), 1, a.add...)
	}
}

// tracer starts one consumer span per handled record, continuing the trace
// of a W3C traceparent header when the record has one.
type tracer struct {
	t    trace.Tracer
	prop propagation.TraceContext
	// off is set when the provider is a no-op one: then no span is started
	// at all, which saves the handler context's allocation per record. A
	// traceparent header still reaches the handler's context.
	off bool
}

var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// noSpan is the span of every record when tracing is off.
var noSpan = trace.SpanFromContext(context.Background())

func newTracer(tp trace.TracerProvider) tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
		// Before any SDK is installed the global provider is OpenTelemetry's
		// delegating placeholder, whose spans cost three allocations per
		// record and record nothing. Resolve it once, here: a program that
		// installs its provider before New (the usual order) gets real
		// spans; otherwise spans are no-ops, at one allocation.
		if fmt.Sprintf("%T", tp) == "*global.tracerProvider" {
			tp = noop.NewTracerProvider()
		}
	}
	_, off := tp.(noop.TracerProvider)
	return tracer{t: tp.Tracer(instrumentation), off: off}
}

func (tr tracer) start(ctx context.Context, rec *Record) (context.Context, trace.Span) {
	if _, ok := rec.Header("traceparent"); ok {
		ctx = tr.prop.Extract(ctx, headerCarrier(rec.Headers))
	}
	if tr.off {
		return ctx, noSpan
	}
	ctx, span := tr.t.Start(ctx, "tidemark.handle", consumerSpan...)
	if span.IsRecording() {
		// Attributes only for a recording span: building them costs
		// allocations the no-op default should not pay.
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", rec.Topic),
			attribute.Int("messaging.destination.partition.id", int(rec.Partition)),
			attribute.Int64("messaging.kafka.offset", rec.Offset),
		)
		if rec.DeliveryCount > 0 {
			// The broker's count (share groups): the semantic conventions
			// name none for Kafka, so it is ours.
			span.SetAttributes(attribute.Int("tidemark.record.delivery_count", int(rec.DeliveryCount)))
		}
	}
	return ctx, span
}

// headerCarrier reads W3C trace context from record headers.
type headerCarrier []Header

func (h headerCarrier) Get(key string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return string(h[i].Value)
		}
	}
	return ""
}

func (h headerCarrier) Set(string, string) {}

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i := range h {
		keys[i] = h[i].Key
	}
	return keys
}

// Stats is a snapshot of the runner for probes and dashboards, refreshed
// by the poll goroutine every commit interval.
type Stats struct {
	// LoopAt is when the poll goroutine last ran its periodic tick. A
	// liveness probe should fail when it is older than a few commit
	// intervals: the loop itself is stuck, not a handler.
	LoopAt time.Time
	// Stopping is true once a shutdown began.
	Stopping bool
	InFlight int
	Buffered int
	// Bytes is what the runner charges against MaxBufferedBytes: its
	// records' key, value and header bytes as allocated plus
	// RecordOverhead each, and the partitions' tracker rings beyond their
	// least size (they hold finished records behind unfinished ones too).
	Bytes      int64
	Partitions []PartitionStats
}

// PartitionStats describes one owned partition.
type PartitionStats struct {
	TP            TP
	Epoch         uint64
	Safe          int64 // the safe offset to commit, or -1 if unknown yet
	Acknowledged  int64 // the last commit the broker acknowledged, or -1
	HighWatermark int64
	Buffered      int
	InFlight      int
	// Bytes is what its buffered and in-flight records are charged (what
	// ByteWaterMarks bound).
	Bytes  int64
	Paused bool
	// Outstanding is its uncommitted window: records delivered and not yet
	// behind the safe offset (see Window). WindowFull is set while it is
	// paused with its window full.
	Outstanding int
	WindowFull  bool
	// The oldest unfinished record, the one the safe offset waits for:
	// OldestOffset is its offset (-1 when none is unfinished), OldestAge
	// how long it has waited since it was fetched, OldestState why it has
	// not finished, OldestAttempts its failed attempts so far and
	// OldestError the last one's error.
	OldestOffset   int64
	OldestAge      time.Duration
	OldestState    RecordState
	OldestAttempts int
	OldestError    string
}

// RecordState says why an unfinished record has not finished.
type RecordState uint8

const (
	// NoRecord: no record is unfinished.
	NoRecord RecordState = iota
	// Queued: fetched, waiting for a free worker (Concurrency).
	Queued
	// Running: its handler runs, and has not failed yet.
	Running
	// Retrying: its handler failed at least once and is retried with
	// backoff (Block forever; DeadLetter until the write is acknowledged).
	Retrying
	// Fenced: its handler returned ErrFenced; the record, and its key's
	// records after it, are left to the partition's next owner.
	Fenced
)

// String returns "none", "queued", "running", "retrying" or "fenced".
func (s RecordState) String() string {
	switch s {
	case NoRecord:
		return "none"
	case Queued:
		return "queued"
	case Running:
		return "running"
	case Retrying:
		return "retrying"
	case Fenced:
		return "fenced"
	}
	return "RecordState(" + strconv.Itoa(int(s)) + ")"
}

type statsBox struct {
	mu    sync.Mutex
	s     Stats
	spare []PartitionStats // the previous snapshot's, reused by the next
}

// Stats returns the latest snapshot. It is safe to call from any goroutine.
func (r *Runner) Stats() Stats {
	r.stats.mu.Lock()
	defer r.stats.mu.Unlock()
	s := r.stats.s
	s.Partitions = append([]PartitionStats(nil), s.Partitions...)
	return s
}

// snapshot returns the stats as they are now, their partitions appended to
// parts.
func (s *pollState) snapshot(parts []PartitionStats) Stats {
	now := s.now()
	st := Stats{LoopAt: now, Stopping: s.stopping, InFlight: s.inflight, Buffered: s.totalCount, Bytes: s.charged()}
	st.Partitions = parts
	for _, ps := range s.parts {
		outstanding := ps.p.Tracker().Outstanding()
		o := s.oldest(ps)
		st.Partitions = append(st.Partitions, PartitionStats{
			TP: ps.tp, Epoch: uint64(ps.epoch), Safe: ps.p.Safe(), Acknowledged: ps.p.Acknowledged(),
			HighWatermark: ps.hwm, Buffered: ps.count, InFlight: ps.inflight, Bytes: ps.bytes, Paused: ps.srcPaused,
			Outstanding: outstanding, WindowFull: ps.paused && s.cfg.window-outstanding < s.pollChunk(),
			OldestOffset: o.offset, OldestAge: o.age, OldestState: o.state, OldestAttempts: o.attempts, OldestError: o.err,
		})
	}
	return st
}

// oldestRecord describes a partition's oldest unfinished record.
type oldestRecord struct {
	offset   int64 // -1: none
	age      time.Duration
	state    RecordState
	attempts int
	err      string
}

func (o oldestRecord) record(tp TP) string {
	if o.offset < 0 {
		return ""
	}
	return tp.String() + "@" + strconv.FormatInt(o.offset, 10)
}

// oldest finds ps's oldest unfinished record: the tracker's oldest
// outstanding offset. It is the head of ps's list of tasks, or, when it has
// no task any more, the fenced record the safe offset cannot pass. In
// settled mode, with no tracker, it is the head of the list: the first
// delivered of the records not finished.
func (s *pollState) oldest(ps *partState) oldestRecord {
	off, ok := ps.p.Tracker().Oldest()
	if s.settled {
		ok = ps.oldest != nil
		if ok {
			off = ps.oldest.rec.Offset
		}
	}
	if !ok {
		return oldestRecord{offset: -1}
	}
	o := oldestRecord{offset: off}
	now := s.now()
	switch t := ps.oldest; {
	case t != nil && t.rec.Offset == off:
		o.age = now.Sub(t.delivered)
		switch f := t.fail.Load(); {
		case !t.started:
			o.state = Queued
		case f == nil:
			o.state = Running
		default:
			o.state, o.attempts, o.err = Retrying, f.attempts, f.err
		}
	case ps.fencedOff == off:
		o.age, o.state, o.attempts, o.err = now.Sub(ps.fencedAt), Fenced, 1, ps.fencedErr
	}
	return o
}

// publishStats refreshes the snapshot. It reuses the previous snapshot's
// slice: Stats copies under the lock, so nothing else refers to it.
func (r *Runner) publishStats() {
	s := r.poll.snapshot(r.stats.spare[:0])
	r.stats.mu.Lock()
	old := r.stats.s.Partitions
	r.stats.s = s
	r.stats.mu.Unlock()
	clear(old) // drop references to old error strings
	if cap(old) > 4*len(s.Partitions)+16 {
		old = nil // the partitions are far fewer than they were
	}
	r.stats.spare = old
}
