package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

var topicAttr = attribute.String("messaging.destination.name", topic)

// TestDeliveryCountTelemetry: over a source that counts deliveries (a
// Settler, as a share group's), every record the runner takes has its
// delivery count recorded in tidemark.record.delivery_count, those
// delivered before (count > 1) are counted in tidemark.records.redelivered,
// both per topic, and each record's span carries the count.
func TestDeliveryCountTelemetry(t *testing.T) {
	// recs gives offset o the delivery count o%3+1: 1, 2, 3, 1, 2, 3, 1.
	src := newSettleSource(runner.Batch{TP: tp(0), Records: recs(0, 1, 2, 3, 4, 5, 6), Position: -1, HighWatermark: -1})
	m := newMeter()
	spans := tracetest.NewSpanRecorder()
	prov := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer prov.Shutdown(context.Background())
	r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.Failure(runner.Skip(1)), runner.MeterProvider(m.provider), runner.TracerProvider(prov))
	wait := started(t, r)
	src.waitSettled(t, 7)
	shutdownAndWait(t, r, wait)

	red, ok := m.metric(t, "tidemark.records.redelivered").(metricdata.Sum[int64])
	if !ok || len(red.DataPoints) != 1 {
		t.Fatalf("tidemark.records.redelivered: %#v, want one data point", m.metric(t, "tidemark.records.redelivered"))
	}
	if dp := red.DataPoints[0]; dp.Value != 4 || !dp.Attributes.HasValue(topicAttr.Key) {
		t.Errorf("tidemark.records.redelivered = %d with %v, want 4 (counts 2, 3, 2, 3) for topic %q", dp.Value, dp.Attributes.ToSlice(), topic)
	} else if v, _ := dp.Attributes.Value(topicAttr.Key); v.AsString() != topic {
		t.Errorf("tidemark.records.redelivered topic %q, want %q", v.AsString(), topic)
	}

	h, ok := m.metric(t, "tidemark.record.delivery_count").(metricdata.Histogram[int64])
	if !ok || len(h.DataPoints) != 1 {
		t.Fatalf("tidemark.record.delivery_count: %#v, want one data point", m.metric(t, "tidemark.record.delivery_count"))
	}
	dp := h.DataPoints[0]
	if v, _ := dp.Attributes.Value(topicAttr.Key); v.AsString() != topic {
		t.Errorf("tidemark.record.delivery_count topic %q, want %q", v.AsString(), topic)
	}
	if dp.Count != 7 || dp.Sum != 13 {
		t.Errorf("tidemark.record.delivery_count: %d records summing to %d, want 7 summing to 13", dp.Count, dp.Sum)
	}
	wantBounds := []float64{1, 2, 3, 4, 5, 10}
	wantCounts := []uint64{3, 2, 2, 0, 0, 0, 0} // ≤1, ≤2, ≤3, ≤4, ≤5, ≤10, >10
	if !equal(dp.Bounds, wantBounds) || !equal(dp.BucketCounts, wantCounts) {
		t.Errorf("tidemark.record.delivery_count buckets %v: %v, want %v: %v", dp.Bounds, dp.BucketCounts, wantBounds, wantCounts)
	}

	ended := spans.Ended()
	if len(ended) != 7 {
		t.Fatalf("%d spans ended, want 7", len(ended))
	}
	for _, s := range ended {
		var off, count int64 = -1, -1
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "messaging.kafka.offset":
				off = kv.Value.AsInt64()
			case "tidemark.record.delivery_count":
				count = kv.Value.AsInt64()
			}
		}
		if off < 0 || count != off%3+1 {
			t.Errorf("span of offset %d has tidemark.record.delivery_count %d, want %d", off, count, off%3+1)
		}
	}
}

// TestNoDeliveryCountFromGroupSource: a consumer-group source does not
// count deliveries (Record.DeliveryCount 0): nothing is recorded in the
// delivery-count metrics and spans carry no count, rather than a false 0.
func TestNoDeliveryCountFromGroupSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 5, 5)
		m := newMeter()
		spans := tracetest.NewSpanRecorder()
		prov := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		defer prov.Shutdown(context.Background())
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
			runner.MeterProvider(m.provider), runner.TracerProvider(prov), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "all 5 committed", committedAt(src, 0, 5))
		if n := m.sum(t, "tidemark.records.handled"); n != 5 {
			t.Fatalf("%d records handled, want 5", n)
		}
		if h, ok := m.metric(t, "tidemark.record.delivery_count").(metricdata.Histogram[int64]); ok && len(h.DataPoints) > 0 {
			t.Errorf("tidemark.record.delivery_count recorded %d times from a source that counts no deliveries, want none", h.DataPoints[0].Count)
		}
		if n := m.sum(t, "tidemark.records.redelivered"); n != 0 {
			t.Errorf("tidemark.records.redelivered = %d, want 0", n)
		}
		ended := spans.Ended()
		if len(ended) != 5 {
			t.Fatalf("%d spans ended, want 5", len(ended))
		}
		for _, s := range ended {
			for _, kv := range s.Attributes() {
				if kv.Key == "tidemark.record.delivery_count" {
					t.Errorf("span %s carries tidemark.record.delivery_count %v, want none", s.Name(), kv.Value.Emit())
				}
			}
		}
	})
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSettledTelemetry: every settlement the runner hands a Settler is
// counted in tidemark.records.settled, by topic and outcome: here four
// records accepted and one (failing) rejected by Skip.
func TestSettledTelemetry(t *testing.T) {
	src := newSettleSource(runner.Batch{TP: tp(0), Records: recs(0, 1, 2, 3, 4), Position: -1, HighWatermark: -1})
	m := newMeter()
	r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
		if rec.Offset == 2 {
			return errors.New("poison")
		}
		return nil
	}), runner.Failure(runner.Skip(1)), runner.MeterProvider(m.provider))
	wait := started(t, r)
	src.waitSettled(t, 5)
	shutdownAndWait(t, r, wait)
	sum, ok := m.metric(t, "tidemark.records.settled").(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("tidemark.records.settled: %#v, want a sum", m.metric(t, "tidemark.records.settled"))
	}
	got := map[string]int64{}
	for _, dp := range sum.DataPoints {
		if v, _ := dp.Attributes.Value(topicAttr.Key); v.AsString() != topic {
			t.Errorf("tidemark.records.settled topic %q, want %q", v.AsString(), topic)
		}
		v, _ := dp.Attributes.Value("tidemark.settlement")
		got[v.AsString()] += dp.Value
	}
	if want := map[string]int64{"accepted": 4, "rejected": 1}; len(got) != len(want) || got["accepted"] != 4 || got["rejected"] != 1 {
		t.Errorf("tidemark.records.settled by outcome %v, want %v", got, want)
	}
}
