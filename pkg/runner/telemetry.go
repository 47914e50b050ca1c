package runner

import (
	"context"
	"fmt"
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
	commitFailures              metric.Int64Counter
	replaySkipped, fenced       metric.Int64Counter
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
	gauge := func(name, desc string, opts ...metric.Int64ObservableGaugeOption) metric.Int64ObservableGauge {
		g, e := m.Int64ObservableGauge(name, append(opts, metric.WithDescription(desc))...)
		if e != nil && err == nil {
			err = e
		}
		return g
	}
	inflight := gauge("tidemark.records.in_flight", "Records whose handler is running.")
	buffered := gauge("tidemark.records.buffered", "Records fetched and not finished (buffered plus in flight).")
	charged := gauge("tidemark.records.bytes", "What the runner charges against MaxBufferedBytes: its records' key, value and header bytes as allocated plus RecordOverhead each, and the tracker slots of finished records behind unfinished ones.", metric.WithUnit("By"))
	paused := gauge("tidemark.partitions.paused", "Partitions paused by flow control.")
	owned := gauge("tidemark.partitions.owned", "Partitions assigned to this member.")
	lag := gauge("tidemark.consumer.lag", "High watermark minus the acknowledged committed offset, per partition.")
	oldest, e := m.Float64ObservableGauge("tidemark.record.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished record, per partition."))
	if e != nil && err == nil {
		err = e
	}
	if err != nil {
		return nil, err
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := r.Stats()
		o.ObserveInt64(inflight, int64(s.InFlight))
		o.ObserveInt64(buffered, int64(s.Buffered))
		o.ObserveInt64(charged, s.Bytes)
		o.ObserveInt64(owned, int64(len(s.Partitions)))
		var np int64
		for i := range s.Partitions {
			p := &s.Partitions[i]
			part := metric.WithAttributes(
				attribute.String("messaging.destination.name", p.TP.Topic),
				attribute.Int("messaging.destination.partition.id", int(p.TP.Partition)))
			if p.Paused {
				np++
			}
			o.ObserveFloat64(oldest, p.OldestAge.Seconds(), part)
			if p.HighWatermark >= 0 && p.Acknowledged >= 0 {
				o.ObserveInt64(lag, max(p.HighWatermark-p.Acknowledged, 0), part)
			}
		}
		o.ObserveInt64(paused, np)
		return nil
	}, inflight, buffered, charged, paused, owned, oldest, lag)
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
	// RecordOverhead each, and the tracker slots of finished records
	// behind unfinished ones.
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
	// OldestAge is how long the oldest unfinished record has waited since it
	// was fetched; zero when none is unfinished.
	OldestAge time.Duration
}

type statsBox struct {
	mu sync.Mutex
	s  Stats
}

// Stats returns the latest snapshot. It is safe to call from any goroutine.
func (r *Runner) Stats() Stats {
	r.stats.mu.Lock()
	defer r.stats.mu.Unlock()
	s := r.stats.s
	s.Partitions = append([]PartitionStats(nil), s.Partitions...)
	return s
}

func (r *Runner) publishStats() {
	now := time.Now()
	s := Stats{LoopAt: now, Stopping: r.stopping, InFlight: r.inflight, Buffered: r.totalCount, Bytes: r.charged()}
	for _, ps := range r.parts {
		p := PartitionStats{
			TP: ps.tp, Epoch: uint64(ps.epoch), Safe: ps.p.Safe(), Acknowledged: ps.p.Acknowledged(),
			HighWatermark: ps.hwm, Buffered: ps.count, InFlight: ps.inflight, Bytes: ps.bytes, Paused: ps.srcPaused,
		}
		if ps.oldest != nil {
			p.OldestAge = now.Sub(ps.oldest.delivered)
		}
		s.Partitions = append(s.Partitions, p)
	}
	r.stats.mu.Lock()
	r.stats.s = s
	r.stats.mu.Unlock()
}
