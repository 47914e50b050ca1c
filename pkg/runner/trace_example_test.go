package runner_test

import (
	"context"
	"log"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// A service installs its SDK and propagators globally (before or after
// New: the runner follows the global tracer provider); every record then
// gets a "process <topic>" span, continuing the trace its producer wrote
// into its headers, with the producer's baggage in the handler's ctx.
// (Not run: it changes OpenTelemetry's global state.)
func ExampleTracerProvider() {
	tp := sdktrace.NewTracerProvider() // with sdktrace.WithBatcher(an exporter)
	defer tp.Shutdown(context.Background())
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	src := runnertest.New() // franz.New(brokers, group, topics) in a service
	r, err := runner.New(src, runner.Handle("orders", func(ctx context.Context, rec runner.Record) error {
		// ctx carries the record's span: spans started from it, and
		// records produced with it, continue the trace.
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
