package runner

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestRecordTelemetryAllocatesNothingWhenTracingIsOff: a record's
// telemetry — its span start and end, the consumed count, a failed
// attempt, its retry, the handled count and the process duration — costs
// no allocation per record with tracing off, whether no provider is
// installed (OpenTelemetry's global placeholders, which the runner follows
// as they change) or no-op ones are, also with the metric SDK recording
// (the partition's attributes are built once) and with a traceparent
// header and no propagator installed. This is docs/performance.md's
// promise; it used to rest on a check of otel's internal type names.
func TestRecordTelemetryAllocatesNothingWhenTracingIsOff(t *testing.T) {
	traceparent := []Header{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}
	for _, tc := range []struct {
		name    string
		mp      metric.MeterProvider
		tp      trace.TracerProvider
		headers []Header
	}{
		{"no provider installed", nil, nil, nil},
		{"no provider installed, traceparent header", nil, nil, traceparent},
		{"no-op providers", metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider(), nil},
		{"no-op providers, traceparent header", metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider(), traceparent},
		{"metric SDK, no tracer provider", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel, tk := telemetryForTest(t, tc.mp, tc.tp)
			tk.rec.Headers = tc.headers
			failure := errors.New("transient")
			run := func() {
				ctx, pr := tel.begin(tk.ps.ctx, tk)
				pr.failed(ctx, failure, 1)
				pr.retry(ctx, 1)
				tk.res = resHandled
				pr.handled(ctx, 1)
				pr.end(ctx)
			}
			run() // the first record learns the tracer provider is off, and makes the SDK's data points
			if n := testing.AllocsPerRun(1000, run); n != 0 {
				t.Errorf("a record's telemetry allocates %v times, want 0", n)
			}
		})
	}
}

// telemetryForTest returns the telemetry of a runner of group "g" over
// topic "t", with mp and tp (nil: the global ones), and a task of record
// t/0@7 of an assigned partition.
func telemetryForTest(t *testing.T, mp metric.MeterProvider, tp trace.TracerProvider) (*telemetry, *task) {
	t.Helper()
	r := &Runner{group: "g"}
	r.cfg.handlers = map[string]*route{"t": {topic: "t"}}
	r.cfg.tracerProvider = tp
	tel, err := newTelemetry(mp, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tel.unregister)
	part := TP{Topic: "t", Partition: 0}
	ps := &partState{tp: part, ctx: context.Background(), tel: tel.partition(part)}
	return tel, &task{rec: Record{Topic: "t", Partition: 0, Offset: 7, Key: []byte("k")}, ps: ps}
}
