package runner

import (
	"testing"

	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// TestTracerProviderOption: a provider given with TracerProvider is used
// as it is, except the global one itself, which the runner follows as the
// global provider (so an SDK installed later replaces it, as it does when
// no provider is given).
func TestTracerProviderOption(t *testing.T) {
	var tr tracer
	tr.init(otel.GetTracerProvider())
	if tr.fixed != nil {
		t.Errorf("the global provider passed explicitly is fixed (%T), want it followed as the global one", tr.fixed)
	}
	tr.init(nil)
	if tr.fixed != nil {
		t.Errorf("no provider: fixed %T, want the global one followed", tr.fixed)
	}
	np := tracenoop.NewTracerProvider()
	tr.init(np)
	if tr.fixed != np {
		t.Errorf("a no-op provider: fixed %v, want it", tr.fixed)
	}
	if c := tr.current(); c.tp != np {
		t.Errorf("current tracer's provider %v, want the one given", c.tp)
	}
}
