package runner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestBatchKeyOrderUnderFailures: batches of a KeyOrder topic with a hot
// key, failing at random records with a *BatchError (and now and then as
// a whole): every record completes exactly once, each key's records
// complete in offset order, no two batches holding one key run at once,
// and the commit reaches the end of every partition.
func TestBatchKeyOrderUnderFailures(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const parts, n = 3, 400
				src := runnertest.New()
				for p := range int32(parts) {
					recs := make([]runner.Record, n)
					for i := range recs {
						k := "hot"
						if i%3 == 0 {
							k = fmt.Sprint("k", i%11)
						}
						recs[i] = runner.Record{Topic: topic, Partition: p, Offset: int64(i), Key: []byte(k)}
					}
					src.Append(recs...)
				}
				rng := rand.New(rand.NewPCG(seed, 1))
				var mu sync.Mutex
				done := map[string][]int64{} // "p/key" -> completed offsets in order
				count := map[[2]int64]int{}
				busy := map[string]bool{}
				var violation error
				r := newRunner(t, src, runner.HandleBatch(topic, func(ctx context.Context, recs []runner.Record) error {
					mu.Lock()
					keys := map[string]bool{}
					for _, rec := range recs {
						k := fmt.Sprint(rec.Partition, "/", string(rec.Key))
						if busy[k] && violation == nil {
							violation = fmt.Errorf("key %s in two batches at once", k)
						}
						keys[k] = true
					}
					for k := range keys {
						busy[k] = true
					}
					upto, err := len(recs), error(nil)
					switch x := rng.IntN(10); {
					case x < 3:
						upto = rng.IntN(len(recs))
						err = &runner.BatchError{Index: upto, Err: errPoison}
					case x == 3:
						upto, err = 0, errPoison
					}
					for _, rec := range recs[:upto] {
						k := fmt.Sprint(rec.Partition, "/", string(rec.Key))
						done[k] = append(done[k], rec.Offset)
						count[[2]int64{int64(rec.Partition), rec.Offset}]++
					}
					nap := time.Duration(rng.IntN(3)) * time.Millisecond
					mu.Unlock()
					time.Sleep(nap)
					mu.Lock()
					for k := range keys {
						busy[k] = false
					}
					mu.Unlock()
					return err
				}, runner.BatchSize(7), runner.BatchWait(time.Millisecond)),
					runner.Concurrency(4), runner.Backoff(time.Millisecond, time.Millisecond),
					runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
				started(t, r)
				assign(t, src, tp(0), tp(1), tp(2))
				await(t, time.Minute, "every partition committed to its end", func() bool {
					for p := range int32(parts) {
						if !committedAt(src, p, n)() {
							return false
						}
					}
					return true
				})
				mu.Lock()
				defer mu.Unlock()
				if violation != nil {
					t.Fatal(violation)
				}
				for p := range int64(parts) {
					for off := range int64(n) {
						if c := count[[2]int64{p, off}]; c != 1 {
							t.Fatalf("%d/%d completed %d times", p, off, c)
						}
					}
				}
				for k, offs := range done {
					for i := 1; i < len(offs); i++ {
						if offs[i] <= offs[i-1] {
							t.Fatalf("key %s completed out of order: %v", k, offs)
						}
					}
				}
			})
		})
	}
}
