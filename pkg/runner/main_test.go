package runner_test

import (
	"fmt"
	"os"
	"testing"

	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests (every
// runner goroutine must be gone once Run returns), or if a test left
// OpenTelemetry's global providers or propagator changed: the globals
// delegate to the first provider set and cannot be restored, so such a
// test changes what every later one measures. A test that sets them
// runs its body in a child process (isolated), where this check is off.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(globalsKept{m})
}

type globalsKept struct{ m *testing.M }

func (g globalsKept) Run() int {
	tp, mp, prop := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	code := g.m.Run()
	if os.Getenv(isolatedEnv) != "" {
		return code
	}
	for what, changed := range map[string]bool{
		"tracer provider": otel.GetTracerProvider() != tp,
		"meter provider":  otel.GetMeterProvider() != mp,
		"propagator":      otel.GetTextMapPropagator() != prop,
	} {
		if changed {
			fmt.Fprintf(os.Stderr, "FAIL: a test left OpenTelemetry's global %s changed; set globals only in isolated (a child process)\n", what)
			code = 1
		}
	}
	return code
}
