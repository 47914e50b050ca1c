package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
)

// BenchmarkPipelineBatch is BenchmarkPipeline for a topic registered with
// HandleBatch: the runner's cost per record end to end, batches formed,
// run and taken back, over the same generating source. size=1 is the
// naive baseline beside the batched sizes: each batch costs its own
// allocations and one handler call.
func BenchmarkPipelineBatch(b *testing.B) {
	for _, mode := range []runner.Ordering{runner.KeyOrder, runner.PartitionOrder, runner.Unordered} {
		for _, size := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("%s/size=%d/concurrency=64", mode, size), func(b *testing.B) {
				var handled atomic.Int64
				all := make(chan struct{})
				n := int64(b.N)
				h := func(ctx context.Context, recs []runner.Record) error {
					if handled.Add(int64(len(recs))) == n {
						close(all)
					}
					return nil
				}
				src := newGenSource(b.N)
				r, err := runner.New(src, runner.HandleBatch(topic, h, runner.BatchSize(size)), runner.Concurrency(64), runner.Order(mode),
					runner.WaterMarks(10000, 5000), runner.Logger(slog.New(slog.DiscardHandler)))
				if err != nil {
					b.Fatal(err)
				}
				timeRun(b, r, all)
				if got := src.committedTotal(); got != int64(b.N) {
					b.Fatalf("committed %d records, want %d", got, b.N)
				}
			})
		}
	}
}
