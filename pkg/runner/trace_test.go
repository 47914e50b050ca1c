package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestSpanPerRecordContinuesTraceparent: with a tracer provider, each
// handled record gets one consumer span, a child of the record's W3C
// traceparent when it has one, and the handler's ctx carries it.
func TestSpanPerRecordContinuesTraceparent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		prov := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer prov.Shutdown(context.Background())
		const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		src := runnertest.New()
		src.Append(
			runner.Record{Topic: topic, Offset: 0, Key: []byte("a"),
				Headers: []runner.Header{{Key: "traceparent", Value: []byte("00-" + traceID + "-00f067aa0ba902b7-01")}}},
			runner.Record{Topic: topic, Offset: 1, Key: []byte("b")},
		)
		seen := make(chan trace.SpanContext, 2)
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			seen <- trace.SpanContextFromContext(ctx)
			return nil
		}), runner.TracerProvider(prov), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "both committed", committedAt(src, 0, 2))
		await(t, time.Second, "two spans ended", func() bool { return len(rec.Ended()) == 2 })
		var withParent int
		for _, s := range rec.Ended() {
			if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "tidemark.handle" {
				t.Errorf("span %q kind %v, want a consumer span tidemark.handle", s.Name(), s.SpanKind())
			}
			if s.SpanContext().TraceID().String() == traceID {
				withParent++
				if s.Parent().SpanID().String() != "00f067aa0ba902b7" {
					t.Errorf("span's parent %s, want the traceparent's span", s.Parent().SpanID())
				}
			}
		}
		if withParent != 1 {
			t.Fatalf("%d spans continue the record's trace, want 1", withParent)
		}
		for range 2 {
			if sc := <-seen; !sc.IsValid() {
				t.Fatal("the handler's ctx carries no span")
			}
		}
	})
}
