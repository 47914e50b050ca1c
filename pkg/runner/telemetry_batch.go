package runner

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// maxBatchLinks bounds the links of a batch's span: one per record with a
// creation context, as the conventions ask, up to the SDK's default limit
// of links per span.
const maxBatchLinks = 128

// batchProcessing is one batch's run through the failure policy as
// telemetry sees it, as processing is a record's: one span for the batch,
// the counts per record.
type batchProcessing struct {
	tel   *telemetry
	b     *batch
	span  trace.Span
	start time.Time // zero: the duration is not measured
	err   error     // the last failed attempt's
}

// beginBatch starts b's processing: its span and the count of
// messaging.client.consumed.messages for each of its records.
func (tel *telemetry) beginBatch(ctx context.Context, b *batch) (context.Context, batchProcessing) {
	pt := b.ps.tel
	ctx, span := tel.tracer.startBatch(ctx, b, pt)
	tel.consumed.Add(ctx, int64(len(b.tasks)), pt.procAdd...)
	p := batchProcessing{tel: tel, b: b, span: span}
	if tel.duration.Enabled(ctx) {
		p.start = time.Now()
	}
	return ctx, p
}

// handled counts n records of the batch as handled.
func (p *batchProcessing) handled(ctx context.Context, n int) {
	p.tel.handledC.Add(ctx, int64(n), p.b.ps.tel.add...)
}

// failed counts a failed attempt of n records, whose error err the span
// records.
func (p *batchProcessing) failed(ctx context.Context, err error, n int) {
	p.err = err
	p.tel.failedC.Add(ctx, int64(n), p.b.ps.tel.add...)
	p.span.RecordError(err)
}

// retry counts an attempt of n records retried after a failure.
func (p *batchProcessing) retry(ctx context.Context, n int) {
	p.tel.retried.Add(ctx, int64(n), p.b.ps.tel.add...)
}

// skip counts one record skipped after its last attempt.
func (p *batchProcessing) skip(ctx context.Context) {
	p.tel.skipped.Add(ctx, 1, p.b.ps.tel.add...)
}

// fence counts n records fenced by a newer owner.
func (p *batchProcessing) fence(ctx context.Context, err error, n int) {
	p.err = err
	p.tel.fenced.Add(ctx, int64(n), p.b.ps.tel.add...)
	p.span.RecordError(err)
}

// cancelled records that ctx ended during the attempt that returned err.
func (p *batchProcessing) cancelled(err error) {
	p.err = err
	p.span.RecordError(err)
}

// end ends the batch's processing: a batch with any record not handled
// is a failed process operation (status Error, error.type of the last
// error), as for a record; the duration is recorded once for the batch.
func (p *batchProcessing) end(ctx context.Context) {
	pt := p.b.ps.tel
	var et string
	worst := resHandled
	for _, t := range p.b.tasks {
		if t.res != resHandled {
			worst = t.res
			break
		}
	}
	if worst != resHandled {
		et = errorType(p.err)
		if p.span.IsRecording() {
			p.span.SetStatus(codes.Error, outcome(worst))
			p.span.SetAttributes(semconv.ErrorTypeKey.String(et))
		}
	}
	if !p.start.IsZero() {
		d := time.Since(p.start).Seconds()
		if et == "" {
			p.tel.duration.Record(ctx, d, pt.procRec...)
		} else {
			kv := append(pt.proc.ToSlice(), semconv.ErrorTypeKey.String(et))
			p.tel.duration.Record(ctx, d, metric.WithAttributeSet(attribute.NewSet(kv...)))
		}
	}
	p.span.End()
}

// startBatch starts the span of a batch, "process <topic>" as a record's,
// with messaging.batch.message_count. The records' creation contexts are
// links, not a parent: a batch has many, and the conventions correlate a
// batch with its messages by links. Its parent is Run's ctx's span, if
// any. With tracing off nothing is extracted: no record's context is the
// batch's.
func (tr *tracer) startBatch(ctx context.Context, b *batch, pt *partTel) (context.Context, trace.Span) {
	c := tr.current()
	if c.off.Load() {
		return ctx, noSpan
	}
	attrs := make([]attribute.KeyValue, 0, pt.proc.Len()+2)
	for it := pt.proc.Iter(); it.Next(); {
		attrs = append(attrs, it.Attribute())
	}
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingBatchMessageCount(len(b.tasks)))
	var links []trace.Link
	prop := otel.GetTextMapPropagator()
	for _, t := range b.tasks {
		if len(links) == maxBatchLinks {
			break
		}
		if len(t.rec.Headers) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(prop.Extract(context.Background(), (*recordCarrier)(&t.rec)))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := c.tr.Start(ctx, pt.spanName, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
	if !span.IsRecording() && !span.SpanContext().IsValid() {
		c.off.Store(true)
	}
	return ctx, span
}
