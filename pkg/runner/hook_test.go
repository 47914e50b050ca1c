package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestAssignHookSkipsApplied: records the hook reports applied complete
// without running the handler; a failing hook is retried before any record
// of the partition runs.
func TestAssignHookSkipsApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 10, 10)
		var hookCalls atomic.Int32
		var mu sync.Mutex
		var ran []int64
		r, err := runner.New(src,
			runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
				mu.Lock()
				ran = append(ran, rec.Offset)
				mu.Unlock()
				return nil
			}),
			runner.OnAssign(runner.PerPartition(func(ctx context.Context, a runner.Assignment) (runner.Applied, error) {
				if hookCalls.Add(1) < 3 {
					return nil, errors.New("database unavailable")
				}
				return func(off int64) bool { return off < 4 }, nil
			})),
			runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit at the end", committedAt(src, 0, 10))
		if n := hookCalls.Load(); n != 3 {
			t.Fatalf("hook called %d times, want 3 (two failures retried)", n)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ran) != 6 {
			t.Fatalf("handler ran for %v, want offsets 4..9 once each", ran)
		}
		for _, off := range ran {
			if off < 4 {
				t.Fatalf("handler ran for applied offset %d", off)
			}
		}
	})
}

// TestFencedIsNeitherCompletedNorRetried: a handler reporting ErrFenced
// leaves its record incomplete, so the commit stops below it, and it is not
// retried.
func TestFencedIsNeitherCompletedNorRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 10, 10)
		var calls atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 6 {
				calls.Add(1)
				return fmt.Errorf("inbox: lease moved on: %w", runner.ErrFenced)
			}
			return nil
		}), runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit below the fenced record", committedAt(src, 0, 6))
		time.Sleep(time.Second) // fake time: hundreds of commit intervals more
		synctest.Wait()
		if off, _ := src.Committed(tp(0)); off != 6 {
			t.Fatalf("commit %d passed the fenced record 6", off)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("fenced record ran %d times, want 1 (no retry)", n)
		}
	})
}

// TestAssignHookSeesGeneration: the hook gets the generation and member id
// of each assignment as the source reports them — runnertest numbers its
// Assign calls 1, 2, … and AssignGeneration gives one explicitly (the same
// one again, or -1 for a source that does not know it).
func TestAssignHookSeesGeneration(t *testing.T) {
	src := runnertest.New()
	src.Member = "m-1"
	got := make(chan runner.Assignment, 8)
	r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.OnAssign(runner.PerPartition(func(ctx context.Context, a runner.Assignment) (runner.Applied, error) {
			got <- a
			return nil, nil
		})))
	started(t, r)
	ctx := context.Background()
	step := func(name string, do func() error, want runner.Assignment) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if a := <-got; a != want {
			t.Fatalf("%s: hook got %+v, want %+v", name, a, want)
		}
		if err := src.Revoke(ctx, want.TP); err != nil {
			t.Fatalf("%s: revoke: %v", name, err)
		}
	}
	step("first Assign", func() error { return src.Assign(ctx, tp(0)) },
		runner.Assignment{TP: tp(0), Start: -1, Generation: 1, Member: "m-1"})
	step("second Assign", func() error { return src.Assign(ctx, tp(1)) },
		runner.Assignment{TP: tp(1), Start: -1, Generation: 2, Member: "m-1"})
	step("same generation again", func() error { return src.AssignGeneration(ctx, 2, tp(0)) },
		runner.Assignment{TP: tp(0), Start: -1, Generation: 2, Member: "m-1"})
	step("unknown generation", func() error { return src.AssignGeneration(ctx, runner.NoGeneration, tp(1)) },
		runner.Assignment{TP: tp(1), Start: -1, Generation: -1, Member: "m-1"})
	step("Assign counts on from the highest", func() error { return src.Assign(ctx, tp(0)) },
		runner.Assignment{TP: tp(0), Start: -1, Generation: 3, Member: "m-1"})
}

// TestFencedHoldsItsKey: a fenced record is left to the next owner, and so
// are the records of its key after it: if the fence was transient, the
// next record of the key must not apply before the fenced one (invariant
// 5). Other keys go on. (The fenced record used to release its lane, and
// the next record of the key ran.)
func TestFencedHoldsItsKey(t *testing.T) {
	for _, mode := range []runner.Ordering{runner.KeyOrder, runner.PartitionOrder} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := runnertest.New()
				src.Append(
					runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")},
					runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte("a")},
					runner.Record{Topic: topic, Partition: 0, Offset: 2, Key: []byte("b")},
				)
				var fenced atomic.Bool
				var mu sync.Mutex
				var ran []int64
				r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
					if rec.Offset == 0 && fenced.CompareAndSwap(false, true) {
						return fmt.Errorf("inbox: lease moved on: %w", runner.ErrFenced) // once: transient
					}
					mu.Lock()
					ran = append(ran, rec.Offset)
					mu.Unlock()
					return nil
				}), runner.Order(mode), runner.CommitInterval(time.Millisecond))
				started(t, r)
				assign(t, src, tp(0))
				synctest.Wait()
				time.Sleep(time.Second) // fake time: many commit intervals
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				want := []int64{2} // key b goes on
				if mode == runner.PartitionOrder {
					want = nil // the partition's lane holds behind the fenced record
				}
				if !slices.Equal(ran, want) {
					t.Fatalf("ran %v after offset 0 was fenced, want %v: a later record of the fenced one's lane ran", ran, want)
				}
				if off, ok := src.Committed(tp(0)); ok && off != 0 {
					t.Fatalf("committed %d past the fenced record", off)
				}
			})
		})
	}
}
