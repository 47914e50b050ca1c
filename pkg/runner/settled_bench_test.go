package runner_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
)

// BenchmarkPipelineSettled is BenchmarkPipeline's unordered case in settled
// mode, over a generating Settler whose every record was delivered before
// (DeliveryCount 2, as a share group's redeliveries): no tracker and no
// commits, a Settle call per record, and the delivery-count telemetry on
// every record, with no meter or tracer provider installed.
func BenchmarkPipelineSettled(b *testing.B) {
	var handled atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	h := func(ctx context.Context, rec runner.Record) error {
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	}
	src := &genSettler{genSource: newGenSource(b.N)}
	r, err := runner.New(src, runner.Handle(topic, h), runner.Concurrency(64), runner.Failure(runner.Skip(1)),
		runner.WaterMarks(10000, 5000), runner.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	timeRun(b, r, all)
	if got := src.accepted.Load(); got != int64(b.N) {
		b.Fatalf("accepted %d records, want %d", got, b.N)
	}
}

// genSettler is genSource's records, each with DeliveryCount 2, handed to
// a runner in settled mode; it counts the records settled Accepted.
type genSettler struct {
	*genSource
	accepted atomic.Int64
}

func (g *genSettler) Run(ctx context.Context, sink runner.Sink) error {
	return g.genSource.Run(ctx, redeliveredSink{sink})
}

func (g *genSettler) Settle(_ runner.TP, _ int64, s runner.Settlement) {
	if s == runner.Accepted {
		g.accepted.Add(1)
	}
}

// redeliveredSink marks every record it passes on as a second delivery.
type redeliveredSink struct{ runner.Sink }

func (s redeliveredSink) Fetched(ctx context.Context, bs []runner.Batch) (int, error) {
	for i := range bs {
		for j := range bs[i].Records {
			bs[i].Records[j].DeliveryCount = 2
		}
	}
	return s.Sink.Fetched(ctx, bs)
}
