package runner_test

// Drains: a revoke or a shutdown waiting for in-flight handlers, then its
// final commit, and the reports that come while it waits.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestLostReportCommitsNoneOfItsPartitions: a Lost report naming several
// partitions commits none of them, even when losing the first one lets a
// shutdown drain finish (it used to send a final commit that still
// included the second one).
func TestLostReportCommitsNoneOfItsPartitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 10, 10)
		var done1 atomic.Int64
		h := func(ctx context.Context, rec runner.Record) error {
			if rec.Partition == 0 && rec.Offset == 0 {
				<-ctx.Done() // A stays in flight until lost
				return ctx.Err()
			}
			if rec.Partition == 1 {
				done1.Add(1)
			}
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.Unordered),
			runner.Concurrency(4), runner.CommitInterval(time.Hour))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		synctest.Wait() // the loop took the completions
		if n := done1.Load(); n != 10 {
			t.Fatalf("partition 1 handled %d records, want 10", n)
		}
		// Shutdown: the stop drain waits for A's in-flight handler.
		sdone := make(chan error, 1)
		go func() { sdone <- r.Shutdown(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-sdone:
			t.Fatalf("Shutdown returned (%v) with a handler in flight", err)
		default:
		}
		// The session is lost for both partitions (sorted, as franz reports).
		if err := src.Lose(context.Background(), tp(0), tp(1)); err != nil && !errors.Is(err, runner.ErrStopped) {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case <-sdone:
		default:
			t.Fatal("Shutdown did not return")
		}
		if v := src.Violation(); v != nil {
			t.Fatalf("commit after Lost: %v", v)
		}
	})
}

// TestShutdownWaitsForARevokeDrain: a shutdown that starts while a revoke
// drains waits for that revoke's handlers too, within its budget (it used
// to end at once and cancel them).
func TestShutdownWaitsForARevokeDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 1, 1)
		release := make(chan struct{})
		inHandler := make(chan struct{}, 1)
		var cancelled atomic.Bool
		h := func(ctx context.Context, rec runner.Record) error {
			if rec.Partition == 0 {
				inHandler <- struct{}{}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					cancelled.Store(true)
					return ctx.Err()
				}
			}
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.Unordered),
			runner.Concurrency(4), runner.DrainBudget(10*time.Second))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		<-inHandler
		rdone := make(chan error, 1)
		go func() { rdone <- src.Revoke(context.Background(), tp(0)) }()
		synctest.Wait() // the revoke drains
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sdone := make(chan error, 1)
		go func() { sdone <- r.Shutdown(ctx) }()
		time.Sleep(9 * time.Second) // fake time: within both budgets (10s)
		synctest.Wait()
		close(release)
		serr := <-sdone
		rerr := <-rdone
		if cancelled.Load() {
			t.Fatalf("revoke drain cut short by Shutdown: handler cancelled; Shutdown=%v Revoke=%v", serr, rerr)
		}
		if off, _ := src.Committed(tp(0)); off != 1 {
			t.Fatalf("partition 0 committed %d, want 1 after its drain; Shutdown=%v Revoke=%v", off, serr, rerr)
		}
	})
}
