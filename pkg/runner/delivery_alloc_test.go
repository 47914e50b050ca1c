package runner

import (
	"testing"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestDeliveredAllocatesNothing: measuring a record's delivery count (once
// per record taken from a share source) allocates nothing with telemetry
// off — no provider installed (the global placeholder) or a no-op one —
// nor with the SDK recording (the topic's attributes are built once).
func TestDeliveredAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		mp   metric.MeterProvider
	}{
		{"global placeholder", nil},
		{"noop", metricnoop.NewMeterProvider()},
		{"sdk", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Runner{}
			r.cfg.handlers = map[string]*route{"t": {topic: "t"}}
			tel, err := newTelemetry(tc.mp, r)
			if err != nil {
				t.Fatal(err)
			}
			defer tel.unregister()
			tel.delivered("t", 2) // the SDK's first measurement makes its data point
			if n := testing.AllocsPerRun(1000, func() { tel.delivered("t", 3) }); n != 0 {
				t.Errorf("delivered allocates %v times per record, want 0", n)
			}
		})
	}
}
