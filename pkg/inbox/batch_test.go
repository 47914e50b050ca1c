package inbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// batchStore returns a Store with Batch(n) and a lease on tp, with no
// database behind it (batches run through inbox.BatchHandler's stand-in).
func batchStore(t *testing.T, n int, tps ...runner.TP) *inbox.Store {
	t.Helper()
	s, err := inbox.New(nowhere(t), "g", inbox.Batch(n), inbox.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range tps {
		inbox.SetEpoch(s, tp, 1)
	}
	return s
}

// callResult is how one handler call ended.
type callResult struct {
	off      int64
	err      error
	returned bool // false: it panicked or called runtime.Goexit
	panicked any
}

// TestBatchLeaderStopsOutsideEffect: the goroutine leading a batch unwinds
// outside any effect — a panic (a pgx tracer, a meter provider, a logger)
// or runtime.Goexit (t.FailNow in an effect, which recover does not stop).
// The other records of its batch must get an error, so the runner's
// failure policy runs them again, and the partition must not stay marked
// running: a record that comes later is applied (found in review: the
// batch's records and every later record of the partition waited forever).
func TestBatchLeaderStopsOutsideEffect(t *testing.T) {
	tp := runner.TP{Topic: "t", Partition: 0}
	for _, tt := range []struct {
		name string
		stop func()
	}{
		{"panic", func() { panic("a hook panicked") }},
		{"Goexit", runtime.Goexit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := batchStore(t, 4, tp)
			synctest.Test(t, func(t *testing.T) {
				first, release := make(chan struct{}), make(chan struct{})
				var batches atomic.Int32
				h, parts := inbox.BatchHandler(s, func(recs []runner.Record) []error {
					switch batches.Add(1) {
					case 1: // record 0 alone: hold it while 1, 2 and 3 queue
						close(first)
						<-release
					case 2: // records 1, 2 and 3: the leader stops
						tt.stop()
					}
					return make([]error, len(recs))
				})
				res := make(chan callResult, 5)
				call := func(off int64) {
					go func() {
						r := callResult{off: off}
						defer func() {
							r.panicked = recover()
							res <- r
						}()
						r.err = h(context.Background(), runner.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: off})
						r.returned = true
					}()
				}
				call(0)
				<-first
				for off := int64(1); off <= 3; off++ {
					call(off)
				}
				synctest.Wait() // 1, 2 and 3 are queued behind record 0
				close(release)

				got := map[int64]callResult{}
				timeout := time.After(time.Minute)
				for len(got) < 4 {
					select {
					case r := <-res:
						got[r.off] = r
					case <-timeout:
						t.Fatalf("after a minute only %d of 4 calls returned: the batch's records are stranded", len(got))
					}
				}
				if r := got[0]; !r.returned || r.err != nil {
					t.Fatalf("record 0: %+v, want applied", r)
				}
				stopped := 0
				for off := int64(1); off <= 3; off++ {
					switch r := got[off]; {
					case !r.returned:
						stopped++
						if tt.name == "panic" && r.panicked == nil {
							t.Errorf("record %d: the leader's panic did not reach its caller", off)
						}
					case r.err == nil:
						t.Errorf("record %d: nil, want an error: its batch never finished", off)
					}
				}
				if stopped != 1 {
					t.Fatalf("%d calls stopped, want the leader's alone: %+v", stopped, got)
				}

				// The partition is free: the next record leads and is applied.
				call(4)
				select {
				case r := <-res:
					if !r.returned || r.err != nil {
						t.Fatalf("record 4: %+v, want applied", r)
					}
				case <-time.After(time.Minute):
					t.Fatal("record 4 waited a minute: the partition is still marked running")
				}
				if n := parts(); n != 0 {
					t.Fatalf("the batcher holds %d partitions after they went idle, want 0", n)
				}
			})
		})
	}
}

// TestBatcherForgetsIdlePartitions: the batcher keeps an entry only for a
// partition with a batch running or records waiting, so a consumer that
// sees many partitions over its life (rebalances, topics) does not grow
// without bound (found in review: one entry per partition ever seen).
func TestBatcherForgetsIdlePartitions(t *testing.T) {
	const n = 200
	tps := make([]runner.TP, n)
	for i := range tps {
		tps[i] = runner.TP{Topic: fmt.Sprint("t", i%7), Partition: int32(i)}
	}
	s := batchStore(t, 8, tps...)
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		h, parts := inbox.BatchHandler(s, func(recs []runner.Record) []error {
			if slices.ContainsFunc(recs, func(r runner.Record) bool { return r.Offset == 0 }) {
				<-hold
			}
			return make([]error, len(recs))
		})
		// Every partition busy at once: a batch held open, a record waiting.
		errs := make(chan error, 2*n)
		for _, tp := range tps {
			for off := range int64(2) {
				go func() {
					errs <- h(context.Background(), runner.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: off})
				}()
			}
		}
		synctest.Wait()
		if got := parts(); got != n {
			t.Fatalf("%d partitions while all are busy, want %d", got, n)
		}
		close(hold)
		for range 2 * n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := parts(); got != 0 {
			t.Fatalf("the batcher holds %d partitions after all went idle, want 0", got)
		}
		// And one entry comes back when a partition is used again.
		if err := h(context.Background(), runner.Record{Topic: tps[0].Topic, Partition: tps[0].Partition, Offset: 5}); err != nil {
			t.Fatal(err)
		}
		if got := parts(); got != 0 {
			t.Fatalf("%d partitions after one more record, want 0", got)
		}
	})
}

// TestBatchKeepsARedriveFromItsOrigin: a redriven dead letter and its
// origin record itself (consumed again after an offset reset, on the same
// partition: `dlt replay --to` the origin topic, partitioned by the same
// key) never share a batch. In one the claim takes the redrive for a
// replay of the origin's row claimed just before — and reports it done —
// even if the origin's effect then rolls back to its savepoint: the
// redrive, the one copy that was to apply the event, is lost as a
// replay. Two redrives of one origin are kept apart for this reason
// already (take).
func TestBatchKeepsARedriveFromItsOrigin(t *testing.T) {
	tp := runner.TP{Topic: "t", Partition: 0}
	s := batchStore(t, 4, tp)
	synctest.Test(t, func(t *testing.T) {
		first, release := make(chan struct{}), make(chan struct{})
		var batches atomic.Int32
		var together atomic.Bool
		h, _ := inbox.BatchHandler(s, func(recs []runner.Record) []error {
			if batches.Add(1) == 1 { // record 0 alone: hold it while the others queue
				close(first)
				<-release
			}
			offs := map[int64]bool{}
			for _, r := range recs {
				offs[r.Offset] = true
			}
			if offs[5] && offs[100] {
				together.Store(true)
			}
			return make([]error, len(recs))
		})
		done := make(chan error, 3)
		call := func(rec runner.Record) { go func() { done <- h(context.Background(), rec) }() }
		call(runner.Record{Topic: "t", Offset: 0})
		<-first
		call(runner.Record{Topic: "t", Offset: 5})
		call(runner.Record{Topic: "t", Offset: 100, Headers: []runner.Header{
			{Key: runner.HeaderOriginTopic, Value: []byte("t")},
			{Key: runner.HeaderOriginPartition, Value: []byte("0")},
			{Key: runner.HeaderOriginOffset, Value: []byte("5")},
		}})
		synctest.Wait() // 5 and 100 are queued behind record 0
		close(release)
		for range 3 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if together.Load() {
			t.Fatal("t/0@100, a redrive of t/0@5, shared a batch with t/0@5")
		}
	})
}
