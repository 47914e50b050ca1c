package runner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestAttemptOfARetainedCtx: a context is a value; one a handler hands to
// something that outlives the call (a goroutine, a callback) keeps
// meaning what it meant. Attempt of the first record's ctx stays 1 while a
// later record runs its third attempt.
func TestAttemptOfARetainedCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")})
		var mu sync.Mutex
		var kept context.Context
		var seen []int // Attempt(kept) read during each attempt of offset 1
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			mu.Lock()
			defer mu.Unlock()
			if rec.Offset == 0 {
				kept = ctx
				return nil
			}
			seen = append(seen, runner.Attempt(kept))
			if runner.Attempt(ctx) < 3 {
				return errPoison
			}
			return nil
		}), runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "offset 0 committed", committedAt(src, 0, 1))
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte("b")})
		await(t, time.Second, "offset 1 committed", committedAt(src, 0, 2))
		mu.Lock()
		defer mu.Unlock()
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("during attempt %d of offset 1, Attempt(ctx of offset 0) = %d, want 1 (all: %v)", i+1, n, seen)
			}
		}
	})
}

// TestRetainedCtxOfALostPartition: the ctx of a record of a partition that
// was lost stays cancelled after the runner handled records of another
// partition: a goroutine the handler started and bounded by its ctx must
// not be revived.
func TestRetainedCtxOfALostPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		var mu sync.Mutex
		var kept context.Context
		var errDuring error = errors.New("offset 1 of partition 1 did not run")
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			mu.Lock()
			defer mu.Unlock()
			if rec.Partition == 0 {
				kept = ctx
				return nil
			}
			errDuring = kept.Err()
			return nil
		}), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "p0 committed", committedAt(src, 0, 1))
		if err := src.Lose(context.Background(), tp(0)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		mu.Lock()
		if kept.Err() == nil {
			mu.Unlock()
			t.Fatal("ctx of a record of the lost partition is not cancelled")
		}
		mu.Unlock()
		src.Append(runner.Record{Topic: topic, Partition: 1, Offset: 0})
		await(t, time.Second, "p1 committed", committedAt(src, 1, 1))
		mu.Lock()
		defer mu.Unlock()
		if errDuring == nil {
			t.Fatal("while a record of partition 1 ran, the retained ctx of lost partition 0 reported Err() == nil: it was cancelled before")
		}
	})
}

// TestRetainedCtxRace: a goroutine the handler started waits on the
// handler's ctx after the handler returned (the common "cancel the
// upload when ctx ends" pattern); the runner's next record must not write
// what that goroutine reads. Fails under -race when it does.
func TestRetainedCtxRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var n atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if n.Add(1) == 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-ctx.Done():
					case <-stop:
					}
					_ = runner.Attempt(ctx)
				}()
			}
			return nil
		}), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "offset 0 committed", committedAt(src, 0, 1))
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 1})
		await(t, time.Second, "offset 1 committed", committedAt(src, 0, 2))
		close(stop)
		wg.Wait()
	})
}
