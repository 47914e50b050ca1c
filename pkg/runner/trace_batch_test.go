package runner_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestBatchSpanByTheConventions: a batch gets one CONSUMER span "process
// <topic>" with messaging.batch.message_count and no offset or key, linked
// to the creation context of each of its records that has one (a batch has
// many, so none is its parent); a batch that is dead-lettered ends with
// status Error and error.type.
func TestBatchSpanByTheConventions(t *testing.T) {
	isolated(t, func(t *testing.T) {
		prev := otel.GetTextMapPropagator()
		otel.SetTextMapPropagator(propagation.TraceContext{})
		t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
		synctest.Test(t, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			prov := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			defer prov.Shutdown(context.Background())
			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			parent := func(span string) []runner.Header {
				return []runner.Header{{Key: "traceparent", Value: []byte("00-" + traceID + "-" + span + "-01")}}
			}
			src := groupedSource{runnertest.New()}
			src.Append(
				runner.Record{Topic: topic, Offset: 0, Key: []byte("a"), Headers: parent("00f067aa0ba902b7")},
				runner.Record{Topic: topic, Offset: 1, Key: []byte("b")},
				runner.Record{Topic: topic, Offset: 2, Key: []byte("c"), Headers: parent("00f067aa0ba902b8")},
			)
			d := &dlq{allow: make(chan struct{})}
			close(d.allow)
			calls := 0
			r := newRunner(t, src, runner.HandleBatch(topic, func(ctx context.Context, recs []runner.Record) error {
				calls++
				if calls == 1 {
					return nil // the first batch: all three records
				}
				return errPoison
			}, runner.BatchSize(3), runner.WithPolicy(runner.DeadLetter("t.dlq", 1, d))),
				runner.Order(runner.PartitionOrder), runner.TracerProvider(prov), runner.CommitInterval(2*time.Millisecond))
			started(t, r)
			assign(t, src.Source, tp(0))
			await(t, time.Second, "the batch committed", committedAt(src.Source, 0, 3))
			src.Append(runner.Record{Topic: topic, Offset: 3, Key: []byte("d")})
			await(t, time.Second, "the failed batch dead-lettered", committedAt(src.Source, 0, 4))
			spans := exp.GetSpans()
			if len(spans) != 2 {
				t.Fatalf("%d spans ended, want one per batch, 2", len(spans))
			}
			base := []string{
				"messaging.system=STRING:kafka",
				"messaging.operation.type=STRING:process",
				"messaging.operation.name=STRING:process",
				"messaging.consumer.group.name=STRING:" + group,
				"messaging.destination.name=STRING:" + topic,
				"messaging.destination.partition.id=STRING:0",
			}
			for i, want := range [][]string{
				append(slices.Clone(base), "messaging.batch.message_count=INT64:3"),
				append(slices.Clone(base), "messaging.batch.message_count=INT64:1", "error.type=STRING:*errors.errorString"),
			} {
				s := spans[i]
				slices.Sort(want)
				if got := kvs(s.Attributes); !slices.Equal(got, want) {
					t.Errorf("span %d attributes\n got %v\nwant %v", i, got, want)
				}
				if s.Name != "process "+topic {
					t.Errorf("span %d named %q, want %q", i, s.Name, "process "+topic)
				}
				if s.Parent.IsValid() {
					t.Errorf("span %d has parent %v: a batch's records' contexts are links", i, s.Parent)
				}
			}
			var linked []string
			for _, l := range spans[0].Links {
				linked = append(linked, l.SpanContext.SpanID().String())
			}
			if !slices.Equal(linked, []string{"00f067aa0ba902b7", "00f067aa0ba902b8"}) {
				t.Errorf("first batch linked to %v, want its two records' creation spans", linked)
			}
			if spans[0].Status.Code != codes.Unset || spans[1].Status.Code != codes.Error {
				t.Errorf("statuses %v and %v, want Unset and Error", spans[0].Status, spans[1].Status)
			}
		})
	})
}
