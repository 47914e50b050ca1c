package runner_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestBatchAndRecordTopicsInOneRunner: a topic under Handle and one under
// HandleBatch in one runner share the worker pool: handler calls of both
// never exceed Concurrency together, each key's records of either topic
// complete in offset order, once, and both topics commit to their ends.
func TestBatchAndRecordTopicsInOneRunner(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n, conc = 300, 3
		src := runnertest.New()
		for _, tpc := range []string{"a", "b"} {
			for p := range int32(2) {
				recs := make([]runner.Record, n)
				for i := range recs {
					recs[i] = runner.Record{Topic: tpc, Partition: p, Offset: int64(i), Key: []byte(fmt.Sprint("k", i%4))}
				}
				src.Append(recs...)
			}
		}
		var mu sync.Mutex
		running, peak := 0, 0
		done := map[string][]int64{}
		calls := 0
		enter := func() {
			mu.Lock()
			running++
			peak = max(peak, running)
			calls++
			mu.Unlock()
		}
		leave := func(recs ...runner.Record) {
			mu.Lock()
			running--
			for _, rec := range recs {
				k := fmt.Sprint(rec.Topic, "/", rec.Partition, "/", string(rec.Key))
				done[k] = append(done[k], rec.Offset)
			}
			mu.Unlock()
		}
		r := newRunner(t, src,
			runner.Handle("a", func(ctx context.Context, rec runner.Record) error {
				enter()
				time.Sleep(time.Millisecond)
				if rec.Offset%17 == 5 && runner.Attempt(ctx) == 1 {
					leave()
					return errPoison
				}
				leave(rec)
				return nil
			}),
			runner.HandleBatch("b", func(ctx context.Context, recs []runner.Record) error {
				enter()
				time.Sleep(time.Millisecond)
				if len(recs) > 2 && runner.Attempt(ctx) == 1 {
					leave(recs[:2]...)
					return &runner.BatchError{Index: 2, Err: errPoison}
				}
				leave(recs...)
				return nil
			}, runner.BatchSize(8)),
			runner.Concurrency(conc), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		tps := []runner.TP{{Topic: "a", Partition: 0}, {Topic: "a", Partition: 1}, {Topic: "b", Partition: 0}, {Topic: "b", Partition: 1}}
		assign(t, src, tps...)
		await(t, time.Minute, "both topics committed to their ends", func() bool {
			for _, tp := range tps {
				if off, ok := src.Committed(tp); !ok || off != n {
					return false
				}
			}
			return true
		})
		mu.Lock()
		defer mu.Unlock()
		if peak > conc {
			t.Fatalf("%d handler calls at once, Concurrency is %d", peak, conc)
		}
		total := 0
		for k, offs := range done {
			total += len(offs)
			for i := 1; i < len(offs); i++ {
				if offs[i] <= offs[i-1] {
					t.Fatalf("key %s completed out of order or twice: %v", k, offs)
				}
			}
		}
		if total != 4*n {
			t.Fatalf("%d records completed, want %d", total, 4*n)
		}
	})
}
