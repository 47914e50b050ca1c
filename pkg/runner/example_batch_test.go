package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// A batch handler gets up to BatchSize records of one partition at a time.
// It applies them in one go (one database round trip, one transaction) and
// reports which record failed with a *BatchError: the records before it
// complete, and the batch is retried from it.
func ExampleHandleBatch() {
	src := runnertest.New()
	for off := range int64(5) {
		src.Append(runner.Record{Topic: "orders", Partition: 0, Offset: off, Key: []byte("customer-1")})
	}
	done := make(chan struct{})
	r, err := runner.New(src,
		runner.HandleBatch("orders", func(ctx context.Context, recs []runner.Record) error {
			var offsets []int64
			for _, rec := range recs {
				offsets = append(offsets, rec.Offset)
			}
			fmt.Println("batch", offsets)
			// Apply every record here; on a failure at record i:
			//   return &runner.BatchError{Index: i, Err: err}
			if recs[len(recs)-1].Offset == 4 {
				close(done)
			}
			return nil
		}, runner.BatchSize(2), runner.BatchWait(10*time.Millisecond)),
		runner.Logger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	go r.Run(context.Background())
	if err := src.Assign(context.Background(), runner.TP{Topic: "orders", Partition: 0}); err != nil {
		fmt.Println(err)
		return
	}
	<-done
	if err := r.Shutdown(context.Background()); err != nil {
		fmt.Println(err)
	}
	off, _ := src.Committed(runner.TP{Topic: "orders", Partition: 0})
	fmt.Println("committed", off)
	// Output:
	// batch [0 1]
	// batch [2 3]
	// batch [4]
	// committed 5
}

// batchOption is docs/runner.md's batch handler, compiled.
func batchOption() runner.Option {
	stage := func(context.Context, runner.Record) error { return nil }
	flush := func(context.Context) error { return nil }
	// snippet: batch
	orders := runner.HandleBatch("orders", func(ctx context.Context, recs []runner.Record) error {
		for i, rec := range recs {
			if err := stage(ctx, rec); err != nil {
				return &runner.BatchError{Index: i, Err: err} // recs[:i] are done
			}
		}
		return flush(ctx) // nil completes every record of the batch
	}, runner.BatchSize(200), runner.BatchWait(20*time.Millisecond))
	// end snippet
	return orders
}

var _ = batchOption
