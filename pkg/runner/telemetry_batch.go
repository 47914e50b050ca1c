package runner

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// maxBatchLinks bounds the links of a batch's span: one per record with a
// creation context, as the conventions ask, up to the SDK's default limit
// of links per span.
const maxBatchLinks = 128

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
