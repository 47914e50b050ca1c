package inbox

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestMetricsCarryGroupAndTopic: every inbox metric is measured with the
// Store's group and the record's topic, by the messaging conventions'
// names, with its unit; a measurement allocates nothing once its topic
// was seen.
func TestMetricsCarryGroupAndTopic(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	tel, err := newTelemetry(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), "orders-workers", true)
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{tel: tel}
	ctx := context.Background()
	for _, topic := range []string{"orders", "payments"} {
		s.countApplied(ctx, topic, 3)
		s.countReplays(ctx, topic, 2)
		s.countFenced(ctx, topic)
		s.countRetry(ctx, topic)
		s.countLease(ctx, topic, 10)
		s.countRetaken(ctx, topic)
		s.countPruned(ctx, topic, 7)
		s.countBatch(ctx, topic, 5)
	}
	if n := testing.AllocsPerRun(100, func() { s.countApplied(ctx, "orders", 1) }); n != 0 {
		t.Errorf("countApplied allocates %v times, want 0", n)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{ // name: unit
		"tidemark.inbox.applied": "{record}", "tidemark.inbox.replays": "{record}",
		"tidemark.inbox.fenced": "{transaction}", "tidemark.inbox.retries": "{transaction}",
		"tidemark.inbox.leases": "{lease}", "tidemark.inbox.retaken": "{lease}",
		"tidemark.inbox.pruned": "{row}", "tidemark.inbox.batch.size": "{record}",
	}
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			unit, ok := want[m.Name]
			if !ok {
				t.Errorf("unexpected metric %s", m.Name)
				continue
			}
			seen++
			if m.Unit != unit {
				t.Errorf("%s: unit %q, want %q", m.Name, m.Unit, unit)
			}
			var sets []string
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, render(dp.Attributes.ToSlice()))
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, render(dp.Attributes.ToSlice()))
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			slices.Sort(sets)
			if w := []string{
				"messaging.consumer.group.name=orders-workers,messaging.destination.name=orders",
				"messaging.consumer.group.name=orders-workers,messaging.destination.name=payments",
			}; !slices.Equal(sets, w) {
				t.Errorf("%s: attribute sets %q, want %q", m.Name, sets, w)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("%d of the %d inbox metrics collected", seen, len(want))
	}
}

// render shows a sorted attribute slice as key=value,...
func render(kvs []attribute.KeyValue) string {
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.Emit()
	}
	return strings.Join(parts, ",")
}
