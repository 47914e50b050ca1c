package runner

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// The runner follows the OpenTelemetry semantic conventions v1.43.0 for
// messaging (still "development" there): the newest the otel module in
// go.mod ships with messaging.operation.type, messaging.consumer.group.name
// and messaging.destination.partition.id. Keys and metric names come from
// the semconv package, never typed by hand.
const instrumentation = "github.com/tidemark/tidemark/pkg/runner"

// processOp is the messaging.operation.name of the runner's spans and of
// the semantic conventions' metrics it records: it runs a handler on a
// record pushed to it (messaging.operation.type process, span kind
// CONSUMER: there is no receive span, the application does not pull).
const processOp = "process"

// processBuckets are messaging.process.duration's bucket boundaries in
// seconds: handler latencies from 100 µs (an in-memory effect) to a
// minute (a slow call retried with backoff), about three a decade. The
// SDK's defaults (0 to 10,000) suit milliseconds and would put nearly
// every handler in the first two buckets.
var processBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// durationBuckets bound tidemark.commit.duration and
// tidemark.revoke.duration: a commit takes milliseconds, a revoke's drain
// up to the DrainBudget (10 s by default) and its final commit.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// telemetry holds the runner's OpenTelemetry instruments and its tracer.
// Counters are added to from workers and the poll goroutine (the
// instruments are safe for concurrent use); gauges read the stats snapshot
// the poll goroutine publishes every commit interval.
type telemetry struct {
	tracer tracer
	group  string // the source's (Grouped), or ""

	// The semantic conventions' metrics.
	consumed metric.Int64Counter     // messaging.client.consumed.messages
	duration metric.Float64Histogram // messaging.process.duration

	handledC, failedC           metric.Int64Counter
	retried, deadLettered       metric.Int64Counter
	dlRefused                   metric.Int64Counter
	skipped, stale, lost        metric.Int64Counter
	revokes, pauses, outOfOrder metric.Int64Counter
	commitFailures, windowFull  metric.Int64Counter
	replaySkipped, fenced       metric.Int64Counter
	redelivered, settled        metric.Int64Counter
	deliveries                  metric.Int64Histogram
	batchSize                   metric.Int64Histogram
	commitLatency, revokeTime   metric.Float64Histogram
	groupKV                     []attribute.KeyValue  // none, or messaging.consumer.group.name
	groupAdd                    []metric.AddOption    // the group alone
	groupRec                    []metric.RecordOption // the group alone
	topicAttrs                  map[string]topicOpts
	reg                         metric.Registration
}

// topicOpts are one topic's measurement options, built once: passing a
// prebuilt slice keeps the per-record Add and Record calls allocation-free.
type topicOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
	// settled is the options of tidemark.records.settled, by Settlement
	// (index 0 unused).
	settled [Released + 1][]metric.AddOption
}

// partTel is one partition's telemetry attributes, built once per
// assignment (partition): the per-record Add and Record calls pass these
// prebuilt options and allocate nothing, and the span name is not
// concatenated per record. It is kept small (about 700 bytes): it counts
// in PartitionOverhead.
type partTel struct {
	// add and rec carry the attributes of tidemark's own metrics:
	// messaging.consumer.group.name (when the source has a group),
	// messaging.destination.name and messaging.destination.partition.id.
	add []metric.AddOption
	rec []metric.RecordOption
	// proc is those with messaging.system and messaging.operation.name,
	// the attributes the conventions require of their metrics and the
	// spans' (with messaging.operation.type); procAdd and procRec carry
	// it.
	proc    attribute.Set
	procAdd []metric.AddOption
	procRec []metric.RecordOption
	// spanName is "process <topic>".
	spanName string
}

// newTelemetry creates the instruments on mp (nil: the global meter
// provider) and the tracer on r's TracerProvider (nil: the global one, as
// it changes). It returns every instrument-creation error, joined, rather
// than the first: a misconfigured view or provider shows all it broke.
func newTelemetry(mp metric.MeterProvider, r *Runner) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(semconv.SchemaURL))
	t := &telemetry{group: r.group, topicAttrs: map[string]topicOpts{}}
	t.tracer.init(r.cfg.tracerProvider)
	if t.group != "" {
		t.groupKV = []attribute.KeyValue{semconv.MessagingConsumerGroupName(t.group)}
	}
	groupKV := t.groupKV
	gs := metric.WithAttributeSet(attribute.NewSet(groupKV...))
	t.groupAdd, t.groupRec = []metric.AddOption{gs}, []metric.RecordOption{gs}
	groupObs := []metric.ObserveOption{gs}
	for topic := range r.cfg.handlers {
		a := metric.WithAttributeSet(attribute.NewSet(append(groupKV[:len(groupKV):len(groupKV)], semconv.MessagingDestinationName(topic))...))
		o := topicOpts{add: []metric.AddOption{a}, rec: []metric.RecordOption{a}}
		for st := Accepted; st <= Released; st++ {
			kv := append(groupKV[:len(groupKV):len(groupKV)], semconv.MessagingDestinationName(topic), settlementKey.String(st.String()))
			o.settled[st] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
		}
		t.topicAttrs[topic] = o
	}

	var errs []error
	check := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	consumed, err := messagingconv.NewClientConsumedMessages(m)
	check(consumed.Name(), err)
	t.consumed = consumed.Inst()
	duration, err := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(processBuckets...))
	check(duration.Name(), err)
	t.duration = duration.Inst()

	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(name, err)
		return c
	}
	t.handledC = counter("tidemark.records.handled", "{record}", "Records whose handler succeeded.")
	t.failedC = counter("tidemark.records.failed", "{attempt}", "Failed handler attempts (errors and panics).")
	t.retried = counter("tidemark.records.retried", "{attempt}", "Handler attempts retried after a failure.")
	t.deadLettered = counter("tidemark.records.dead_lettered", "{record}", "Records written to the dead-letter topic.")
	t.skipped = counter("tidemark.records.skipped", "{record}", "Records skipped by the Skip policy.")
	t.dlRefused = counter("tidemark.dead_letters.refused", "{write}", "Dead-letter writes the broker refused for the record as it was (too large or invalid); tidemark.dead_letter.cut says what it lacked already.")
	t.stale = counter("tidemark.completions.stale", "{completion}", "Completions from an old assignment or for a partition not owned, dropped.")
	t.lost = counter("tidemark.partitions.lost", "{partition}", "Partitions lost (nothing committed for them afterwards).")
	t.revokes = counter("tidemark.revokes", "{revoke}", "Revokes drained.")
	t.pauses = counter("tidemark.partitions.pauses", "{pause}", "Times a partition was paused by flow control.")
	t.outOfOrder = counter("tidemark.records.out_of_order", "{record}", "Records delivered again or out of order, dropped.")
	t.replaySkipped = counter("tidemark.records.replay_skipped", "{record}", "Records completed without running the handler because they were already applied.")
	t.fenced = counter("tidemark.records.fenced", "{record}", "Records whose handler was fenced by a newer owner of the partition.")
	t.commitFailures = counter("tidemark.commit.failures", "{commit}", "Partition offsets whose commit failed or had an unknown outcome, counted per partition of the request.")
	t.windowFull = counter("tidemark.partitions.window_pauses", "{pause}", "Times a partition was paused with its uncommitted window full behind an unfinished record.")
	t.settled = counter("tidemark.records.settled", "{record}", "Records the runner settled with a source that settles each record (share groups), by outcome (tidemark.settlement: accepted, rejected or released).")
	t.redelivered = counter("tidemark.records.redelivered", "{record}", "Records the runner took that the broker had delivered before (delivery count above 1; share groups).")
	t.deliveries, err = m.Int64Histogram("tidemark.record.delivery_count", metric.WithUnit("{delivery}"),
		metric.WithDescription("The broker's delivery count of each record the runner took, from sources that count deliveries (share groups): 1 on a first delivery."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	check("tidemark.record.delivery_count", err)
	t.commitLatency, err = m.Float64Histogram("tidemark.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("Commit request latency."), metric.WithExplicitBucketBoundaries(durationBuckets...))
	check("tidemark.commit.duration", err)
	t.revokeTime, err = m.Float64Histogram("tidemark.revoke.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from the source's revoke report to its answer (in-flight handlers drained and the final commit answered), recorded for each partition of the revoke."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	check("tidemark.revoke.duration", err)
	t.batchSize, err = m.Int64Histogram("tidemark.batch.size", metric.WithUnit("{record}"),
		metric.WithDescription("Records in each batch handed to a batch handler (HandleBatch)."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	check("tidemark.batch.size", err)

	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(name, err)
		return g
	}
	inflight := gauge("tidemark.records.in_flight", "{record}", "Records whose handler is running.")
	buffered := gauge("tidemark.records.buffered", "{record}", "Records fetched and not finished (buffered plus in flight).")
	charged := gauge("tidemark.records.bytes", "By", "What the runner charges against MaxBufferedBytes: its records' key, value and header bytes as allocated plus RecordOverhead each, and the partitions' tracker rings beyond their least size.")
	paused := gauge("tidemark.partitions.paused", "{partition}", "Partitions paused by flow control.")
	windowFull := gauge("tidemark.partitions.window_full", "{partition}", "Partitions paused with their uncommitted window full.")
	owned := gauge("tidemark.partitions.owned", "{partition}", "Partitions assigned to this member.")
	uncommitted := gauge("tidemark.partition.uncommitted", "{record}", "Records delivered and not yet behind the safe offset (the uncommitted window), per partition.")
	lag := gauge("tidemark.consumer.lag", "{record}", "High watermark minus the acknowledged committed offset, per partition.")
	oldest, err := m.Float64ObservableGauge("tidemark.record.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished record, per partition; tidemark.record.state says why it has not finished (queued, running, retrying, fenced)."))
	check("tidemark.record.oldest_age", err)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		// Read the snapshot in place: copying it (Stats) would allocate
		// O(partitions) per collection. The per-partition attributes are
		// built per collection (every few seconds), not per record.
		r.stats.mu.Lock()
		defer r.stats.mu.Unlock()
		s := &r.stats.s
		o.ObserveInt64(inflight, int64(s.InFlight), groupObs...)
		o.ObserveInt64(buffered, int64(s.Buffered), groupObs...)
		o.ObserveInt64(charged, s.Bytes, groupObs...)
		o.ObserveInt64(owned, int64(len(s.Partitions)), groupObs...)
		var np, nw int64
		for i := range s.Partitions {
			p := &s.Partitions[i]
			kv := partitionKV(groupKV, p.TP)
			part := metric.WithAttributes(kv...)
			if p.Paused {
				np++
			}
			if p.WindowFull {
				nw++
			}
			o.ObserveFloat64(oldest, p.OldestAge.Seconds(), metric.WithAttributes(
				append(kv, attribute.String("tidemark.record.state", p.OldestState.String()))...))
			o.ObserveInt64(uncommitted, int64(p.Outstanding), part)
			if p.HighWatermark >= 0 && p.Acknowledged >= 0 {
				o.ObserveInt64(lag, max(p.HighWatermark-p.Acknowledged, 0), part)
			}
		}
		o.ObserveInt64(paused, np, groupObs...)
		o.ObserveInt64(windowFull, nw, groupObs...)
		return nil
	}, inflight, buffered, charged, paused, windowFull, owned, uncommitted, oldest, lag)
	if err != nil {
		return nil, fmt.Errorf("registering the gauges' callback: %w", err)
	}
	return t, nil
}

// partitionKV returns group (none, or messaging.consumer.group.name),
// messaging.destination.name and messaging.destination.partition.id (a
// string, as the conventions define it) in a new slice with room for three
// more.
func partitionKV(group []attribute.KeyValue, tp TP) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, len(group)+5)
	kv = append(kv, group...)
	return append(kv, semconv.MessagingDestinationName(tp.Topic),
		semconv.MessagingDestinationPartitionID(strconv.FormatInt(int64(tp.Partition), 10)))
}

// partition builds tp's telemetry attributes, for an assignment of tp.
func (t *telemetry) partition(tp TP) *partTel {
	kv := partitionKV(t.groupKV, tp)
	set := metric.WithAttributeSet(attribute.NewSet(kv...))
	proc := attribute.NewSet(append(kv, semconv.MessagingSystemKafka, semconv.MessagingOperationName(processOp))...)
	procOpt := metric.WithAttributeSet(proc)
	return &partTel{
		add:      []metric.AddOption{set},
		rec:      []metric.RecordOption{set},
		proc:     proc,
		procAdd:  []metric.AddOption{procOpt},
		procRec:  []metric.RecordOption{procOpt},
		spanName: processOp + " " + tp.Topic,
	}
}

func (t *telemetry) unregister() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
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

// settledAs counts a record of topic settled as st.
func (t *telemetry) settledAs(topic string, st Settlement) {
	if st < Accepted || st > Released {
		return
	}
	t.settled.Add(context.Background(), 1, t.topicAttrs[topic].settled[st]...)
}

// settlementKey is the attribute of tidemark.records.settled that names
// the outcome.
const settlementKey = attribute.Key("tidemark.settlement")

// The poll goroutine's measurements of partitions.

// partitionLost counts ps's partition as lost.
func (t *telemetry) partitionLost(ps *partState) {
	t.lost.Add(context.Background(), 1, ps.tel.add...)
}

// revoked records how long the revoke of ps's partition took, d, from
// the source's report to its answer.
func (t *telemetry) revoked(ps *partState, d time.Duration) {
	t.revokeTime.Record(context.Background(), d.Seconds(), ps.tel.rec...)
}

// committed records a commit request's latency (once per request: it
// covers its partitions together) and, when it failed, counts each of its
// partitions' offsets as a commit failure, with the attributes of the
// partition in parts (the owned ones), or new ones for a partition no
// longer owned.
func (t *telemetry) committed(took time.Duration, commits []rebalance.Commit, err error, parts map[TP]*partState) {
	t.commitLatency.Record(context.Background(), took.Seconds(), t.groupRec...)
	if err == nil {
		return
	}
	for _, c := range commits {
		var pt *partTel
		if ps := parts[c.TP]; ps != nil {
			pt = ps.tel
		} else {
			pt = t.partition(c.TP)
		}
		t.commitFailures.Add(context.Background(), 1, pt.add...)
	}
}

// revoke counts a revoke report the runner drains.
func (t *telemetry) revoke() { t.revokes.Add(context.Background(), 1, t.groupAdd...) }

// processing is one record's (or one batch's) run through the failure
// policy as telemetry sees it: its span, when it began (only when the
// duration is measured) and the last failed attempt's error. execute and
// executeBatch keep it on their stack: begin (or beginBatch), then the
// methods below as the attempts go, then end. Counts are of records, n at
// a time for a batch. Every measurement uses its partition's prebuilt
// attributes, so a record that succeeds costs no allocation with tracing
// off.
type processing struct {
	tel   *telemetry
	pt    *partTel
	t     *task  // the record's task; nil for a batch
	b     *batch // the batch; nil for a record
	span  trace.Span
	start time.Time // zero: the duration is not measured
	err   error     // the last failed attempt's
}

// begin starts t's record's processing: its span (a child of the trace
// context its headers carry, see tracer.start) and the count of
// messaging.client.consumed.messages. The returned ctx carries the span,
// and whatever the global propagator extracted (baggage too).
func (tel *telemetry) begin(ctx context.Context, t *task) (context.Context, processing) {
	pt := t.ps.tel
	ctx, span := tel.tracer.start(ctx, &t.rec, pt)
	p := processing{tel: tel, pt: pt, t: t, span: span}
	tel.started(ctx, &p, 1)
	return ctx, p
}

// beginBatch starts b's processing: its span (see tracer.startBatch) and
// the count of messaging.client.consumed.messages for each of its records.
func (tel *telemetry) beginBatch(ctx context.Context, b *batch) (context.Context, processing) {
	pt := b.ps.tel
	ctx, span := tel.tracer.startBatch(ctx, b, pt)
	p := processing{tel: tel, pt: pt, b: b, span: span}
	tel.started(ctx, &p, len(b.tasks))
	return ctx, p
}

// started counts n records consumed and starts p's clock.
func (tel *telemetry) started(ctx context.Context, p *processing, n int) {
	tel.consumed.Add(ctx, int64(n), p.pt.procAdd...)
	// The clock is read only when a meter provider records the duration:
	// two clock reads are a tenth of a no-op record's cost.
	if tel.duration.Enabled(ctx) {
		p.start = time.Now()
	}
}

// handled counts n records as handled.
func (p *processing) handled(ctx context.Context, n int) {
	p.tel.handledC.Add(ctx, int64(n), p.pt.add...)
}

// replaySkip counts the record as completed without its handler: the
// partition's Applied filter said it was applied before.
func (p *processing) replaySkip(ctx context.Context) {
	p.tel.replaySkipped.Add(ctx, 1, p.pt.add...)
}

// failed counts a failed attempt of n records, whose error err the span
// records as an exception event.
func (p *processing) failed(ctx context.Context, err error, n int) {
	p.err = err
	p.tel.failedC.Add(ctx, int64(n), p.pt.add...)
	p.span.RecordError(err)
}

// retry counts an attempt of n records retried after a failure.
func (p *processing) retry(ctx context.Context, n int) {
	p.tel.retried.Add(ctx, int64(n), p.pt.add...)
}

// skip counts one record as skipped after its last attempt.
func (p *processing) skip(ctx context.Context) {
	p.tel.skipped.Add(ctx, 1, p.pt.add...)
}

// fence counts n records as fenced by a newer owner (err wraps
// ErrFenced).
func (p *processing) fence(ctx context.Context, err error, n int) {
	p.err = err
	p.tel.fenced.Add(ctx, int64(n), p.pt.add...)
	p.span.RecordError(err)
}

// cancelled records that ctx ended during the attempt that returned err
// (the partition was lost, or the runner is closing): the records are left
// unfinished, for the next owner.
func (p *processing) cancelled(err error) {
	p.err = err
	p.span.RecordError(err)
}

// deadLetter counts t's record as written to the dead-letter topic.
func (tel *telemetry) deadLetter(ctx context.Context, t *task) {
	tel.deadLettered.Add(ctx, 1, t.ps.tel.add...)
}

// cutNames are the values of the tidemark.dead_letter.cut attribute: what
// the refused dead letter lacked already.
var cutNames = [...]string{"none", "value,headers", "value,headers,key"}

// deadLetterRefused counts a dead-letter write of t's record the broker
// refused as it was (RefusedError), cut cuts times already.
func (tel *telemetry) deadLetterRefused(ctx context.Context, t *task, cuts int) {
	if tel.dlRefused == nil {
		return
	}
	kv := append(partitionKV(tel.groupKV, t.ps.tp), attribute.String("tidemark.dead_letter.cut", cutNames[min(cuts, 2)]))
	tel.dlRefused.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(kv...)))
}

// result is how the processing ended: the record's result, or the first
// of a batch's records that was not handled (resHandled when all were).
func (p *processing) result() result {
	if p.b == nil {
		return p.t.res
	}
	for _, t := range p.b.tasks {
		if t.res != resHandled {
			return t.res
		}
	}
	return resHandled
}

// end ends the processing as its result says. A record (or a batch with a
// record) not handled (dead-lettered, skipped, fenced, or left unfinished)
// is a failed process operation: its span's status is Error and
// error.type, on the span and on messaging.process.duration, names the
// last error (errorType). end records the duration, once for a batch,
// then ends the span.
func (p *processing) end(ctx context.Context) {
	pt := p.pt
	var et string
	if res := p.result(); res != resHandled {
		et = errorType(p.err)
		if p.span.IsRecording() {
			p.span.SetStatus(codes.Error, outcome(res))
			p.span.SetAttributes(semconv.ErrorTypeKey.String(et))
		}
	}
	if !p.start.IsZero() {
		d := time.Since(p.start).Seconds()
		if et == "" {
			p.tel.duration.Record(ctx, d, pt.procRec...)
		} else {
			// A failure is rare: its attribute set is built for it.
			kv := append(pt.proc.ToSlice(), semconv.ErrorTypeKey.String(et))
			p.tel.duration.Record(ctx, d, metric.WithAttributeSet(attribute.NewSet(kv...)))
		}
	}
	p.span.End()
}

// outcome is the span status description of a record not handled.
func outcome(r result) string {
	switch r {
	case resDeadLettered:
		return "dead-lettered"
	case resSkipped:
		return "skipped"
	case resFenced:
		return "fenced by a newer owner"
	case resCancelled:
		return "cancelled: left unfinished for the next owner"
	}
	return "failed"
}

// fmtWrapType is the type of fmt.Errorf's single-%w wrapper.
var fmtWrapType = reflect.TypeOf(fmt.Errorf("%w", errors.New("")))

// errorType is the error.type of a failed record, low in cardinality as
// the conventions ask: the value of an ErrorType() string method anywhere
// in err's chain (how a handler names its own error classes, as the
// semconv package reads them); else the runner's and the context
// package's sentinels by name ("runner.ErrFenced",
// "runner.ErrOutcomeUnknown", "context.Canceled",
// "context.DeadlineExceeded"); else the Go type of the error under the
// Permanent and Transient marks and fmt.Errorf's wrapping, as
// semconv.ErrorType names it ("*runner.PanicError" for a panic,
// "*json.SyntaxError"); "_OTHER" for no error.
func errorType(err error) string {
	if err == nil {
		return semconv.ErrorTypeOther.Value.AsString()
	}
	var named interface{ ErrorType() string }
	if errors.As(err, &named) {
		if s := named.ErrorType(); s != "" {
			return s
		}
	}
	switch {
	case errors.Is(err, ErrFenced):
		return "runner.ErrFenced"
	case errors.Is(err, ErrOutcomeUnknown):
		return "runner.ErrOutcomeUnknown"
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	for {
		switch e := err.(type) {
		case *PermanentError:
			err = e.Err
			continue
		case *TransientError:
			err = e.Err
			continue
		}
		if u := errors.Unwrap(err); u != nil && reflect.TypeOf(err) == fmtWrapType {
			err = u
			continue
		}
		return semconv.ErrorType(err).Value.AsString()
	}
}

// tracer starts one CONSUMER span per record, "process <topic>", after
// the messaging conventions.
//
// Trace context comes from the record's headers through the global
// propagator (otel.GetTextMapPropagator), read per record, so W3C trace
// context, baggage or B3 work as the program installs them; with none
// installed nothing is extracted. The extracted (creation) context is the
// span's parent, and a link as well. Parent, because a record is
// processed alone (one span, one message: the case where the conventions
// allow the creation context as parent), and it puts the consumer under
// the producer in one trace, which is what users of kotel, Spring Kafka
// and Watermill see. A link too, because the conventions' default
// correlation is a link and tools that follow it find it there. Should
// Run's ctx carry a span of its own (ambient), a record with a creation
// context links it rather than have it as parent (it spans the runner's
// life, not the record), and a record without one is its child.
//
// Tracing off costs a record nothing. otel-go v1.47 has no Enabled on
// Tracer (its metric instruments have one, which begin uses), and a
// span from the global placeholder provider, before an SDK is installed,
// costs allocations. So the runner learns it from the spans: per record
// it reads the provider (the global one: one atomic load) and compares it
// with the one it last saw; the first span of each provider tells
// whether it is off: a span that does not record and carries its
// parent's span context rather than one of its own is what the no-op and
// the undelegated global providers return, and no SDK does (an SDK gives
// every span, sampled or not, an identity). While that provider stays,
// no span is started. An SDK installed after New is picked up at the
// next record.
type tracer struct {
	fixed trace.TracerProvider // TracerProvider's, or nil: the global one
	cur   atomic.Pointer[tracerOf]
}

// tracerOf is the runner's tracer on one provider.
type tracerOf struct {
	tp  trace.TracerProvider
	tr  trace.Tracer
	typ reflect.Type
	// comparable: tp == another provider cannot panic. A provider of a
	// type that is not comparable is told apart by its type alone.
	comparable bool
	off        atomic.Bool // its spans are no-ops: start none
}

// noSpan is the span of every record when tracing is off.
var noSpan = trace.SpanFromContext(context.Background())

// init sets the provider: tp, or the global one when tp is nil or is the
// global one itself (then an SDK installed later replaces it too).
func (tr *tracer) init(tp trace.TracerProvider) {
	if tp != nil && reflect.TypeOf(tp).Comparable() && tp == otel.GetTracerProvider() {
		tp = nil
	}
	tr.fixed = tp
}

// current returns the tracer of the provider in use now.
func (tr *tracer) current() *tracerOf {
	tp := tr.fixed
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	c := tr.cur.Load()
	if c != nil && (tr.fixed != nil || c.comparable && c.tp == tp || !c.comparable && c.typ == reflect.TypeOf(tp)) {
		return c
	}
	typ := reflect.TypeOf(tp)
	c = &tracerOf{tp: tp, tr: tp.Tracer(instrumentation, trace.WithSchemaURL(semconv.SchemaURL)), typ: typ, comparable: typ.Comparable()}
	tr.cur.Store(c)
	return c
}

// start extracts rec's trace context and starts its span, with the
// partition's attributes pt, unless tracing is off (then the span is
// noSpan, and ctx carries only what was extracted).
func (tr *tracer) start(ctx context.Context, rec *Record, pt *partTel) (context.Context, trace.Span) {
	c := tr.current()
	if c.off.Load() {
		if len(rec.Headers) > 0 {
			ctx = otel.GetTextMapPropagator().Extract(ctx, (*recordCarrier)(rec))
		}
		return ctx, noSpan
	}
	ambient := trace.SpanContextFromContext(ctx)
	if len(rec.Headers) > 0 {
		ctx = otel.GetTextMapPropagator().Extract(ctx, (*recordCarrier)(rec))
	}
	created := trace.SpanContextFromContext(ctx)
	// The attributes go in at the start, where a sampler sees them (the
	// conventions ask it for the group, destination and partition).
	attrs := make([]attribute.KeyValue, 0, pt.proc.Len()+4)
	for it := pt.proc.Iter(); it.Next(); {
		attrs = append(attrs, it.Attribute())
	}
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingKafkaOffset(int(rec.Offset)))
	// The key only when it is text: the conventions want no attribute for
	// a null key, and none for a key without a canonical string form
	// (binary). An empty key is left out too: the adapters do not all
	// tell it from a null one.
	if len(rec.Key) > 0 && utf8.Valid(rec.Key) {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(rec.Key)))
	}
	if rec.DeliveryCount > 0 {
		// The broker's count (share groups): the conventions name none for
		// Kafka, so it is ours.
		attrs = append(attrs, attribute.Int("tidemark.record.delivery_count", int(rec.DeliveryCount)))
	}
	opts := make([]trace.SpanStartOption, 2, 3)
	opts[0], opts[1] = trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)
	if created.IsValid() && created.IsRemote() && !created.Equal(ambient) {
		// ctx carries the creation context: the parent. Link it too, and
		// the ambient span it displaced.
		links := []trace.Link{{SpanContext: created}}
		if ambient.IsValid() {
			links = append(links, trace.Link{SpanContext: ambient})
		}
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := c.tr.Start(ctx, pt.spanName, opts...)
	if !span.IsRecording() && span.SpanContext().SpanID() == created.SpanID() {
		// Neither recorded nor a span of its own: a no-op provider.
		c.off.Store(true)
	}
	return ctx, span
}

// recordCarrier reads a record's headers for a propagator (the last of a
// repeated key wins; keys match exactly, as Kafka's are case-sensitive).
// It is the record itself, so passing its pointer as a
// propagation.TextMapCarrier allocates nothing, where a []Header would be
// copied to the heap.
type recordCarrier Record

func (c *recordCarrier) Get(key string) string {
	h := c.Headers
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return string(h[i].Value)
		}
	}
	return ""
}

// Set does nothing: the runner reads records, it does not write them.
func (c *recordCarrier) Set(string, string) {}

func (c *recordCarrier) Keys() []string {
	keys := make([]string, len(c.Headers))
	for i := range c.Headers {
		keys[i] = c.Headers[i].Key
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
	// Stopped is true once the poll goroutine ended (Run returns or
	// returned): the runner owns no partition and is in no group, so
	// Partitions is empty, the counts are zero and Member.Joined is
	// false; Stopping says whether a shutdown had begun (false after Close
	// or a source failure). LoopAt is when the loop ended.
	Stopped  bool
	InFlight int
	Buffered int
	// Bytes is what the runner charges against MaxBufferedBytes: its
	// records' key, value and header bytes as allocated plus
	// RecordOverhead each, and the partitions' tracker rings beyond their
	// least size (they hold finished records behind unfinished ones too).
	Bytes      int64
	Partitions []PartitionStats
	// Member is the group membership, read when Stats is called.
	Member MemberStats
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

	// The status page's additions. Fetched is the highest offset the
	// source delivered to the runner in this assignment (-1: none yet).
	// PausedBy says why the partition is paused (zero when Paused is
	// false). OldestKey is the oldest unfinished record's key in printable
	// form, clipped (see printableKey): "" for a nil key or no record, a
	// Go-quoted string for a key that is not printable UTF-8. Lanes is how
	// many of its lanes hold a record queued or running (KeyOrder: keys,
	// PartitionOrder: at most 1, Unordered: 0). DeadLettered and Fenced
	// count its records dead-lettered and fenced since it was assigned to
	// this process (the metrics count over the process's life).
	Fetched      int64
	PausedBy     PauseCause
	OldestKey    string
	Lanes        int
	DeadLettered int64
	Fenced       int64
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
	s := r.stats.s
	s.Partitions = append([]PartitionStats(nil), s.Partitions...)
	r.stats.mu.Unlock()
	s.Member = r.memberStats() // outside the lock: it calls the source
	if s.Stopped {
		// The member may not have seen its leave yet; a stopped runner is
		// in no group whatever it last heard.
		s.Member.Joined = false
	}
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
		windowFull := ps.paused && s.cfg.window-outstanding < s.pollChunk()
		st.Partitions = append(st.Partitions, PartitionStats{
			TP: ps.tp, Epoch: uint64(ps.epoch), Safe: ps.p.Safe(), Acknowledged: ps.p.Acknowledged(),
			HighWatermark: ps.hwm, Buffered: ps.count, InFlight: ps.inflight, Bytes: ps.bytes, Paused: ps.srcPaused,
			Outstanding: outstanding, WindowFull: windowFull,
			OldestOffset: o.offset, OldestAge: o.age, OldestState: o.state, OldestAttempts: o.attempts, OldestError: o.err,
			Fetched: ps.fetched, PausedBy: s.pauseCause(ps, windowFull), OldestKey: s.oldestKey(ps, o),
			Lanes: ps.lanesInUse(), DeadLettered: ps.deadLettered, Fenced: ps.fencedN,
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

// publishStopped publishes the last snapshot, when the poll loop ended:
// the partitions it still held are no longer served (Run cancels their
// handlers), so a status page must not show them as owned.
func (r *Runner) publishStopped() {
	// Stopping stays what it was: true after a shutdown, false when the
	// loop ended on Close or a source failure. Liveness probes tell the
	// two apart by it (a runner that stopped without a shutdown is dead).
	s := Stats{LoopAt: r.poll.now(), Stopping: r.poll.stopping, Stopped: true}
	r.stats.mu.Lock()
	r.stats.s = s
	r.stats.mu.Unlock()
	r.stats.spare = nil
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
