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

// gate blocks handlers of chosen offsets until released.
type gate struct {
	entered chan int64
	release chan struct{}
	block   func(runner.Record) bool
}

func newGate(block func(runner.Record) bool) *gate {
	return &gate{entered: make(chan int64, 100), release: make(chan struct{}), block: block}
}

func (g *gate) handler(ctx context.Context, rec runner.Record) error {
	if g.block(rec) {
		g.entered <- rec.Offset
		select {
		case <-g.release:
		case <-ctx.Done():
			// A lost partition cancels its handlers; keep running anyway
			// to model a handler that finishes its work late.
			<-g.release
		}
	}
	return nil
}

// TestOldEpochCompletionDoesNotMoveCommit checks invariant 3: a handler of
// an old assignment that finishes after a revoke and a reassignment does not
// move the new assignment's commit.
func TestOldEpochCompletionDoesNotMoveCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 20, 20)
		m := newMeter()
		var epoch atomic.Int32 // which assignment a blocked handler belongs to
		oldGate := newGate(func(r runner.Record) bool { return r.Offset == 5 && epoch.Load() == 1 })
		newGate := newGate(func(r runner.Record) bool { return r.Offset == 5 && epoch.Load() == 2 })
		h := func(ctx context.Context, rec runner.Record) error {
			if epoch.Load() == 1 {
				return oldGate.handler(ctx, rec)
			}
			return newGate.handler(ctx, rec)
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.CommitInterval(2*time.Millisecond),
			runner.DrainBudget(50*time.Millisecond), runner.MeterProvider(m.provider))
		started(t, r)
		t.Cleanup(func() {
			select {
			case <-newGate.release:
			default:
				close(newGate.release)
			}
		})
		ctx := context.Background()
		epoch.Store(1)
		if err := src.Assign(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		<-oldGate.entered
		await(t, time.Second, "commit up to the blocked record", committedAt(src, 0, 5))
		// The revoke's drain runs out of budget with offset 5 still running.
		var de *runner.DrainError
		if err := src.Revoke(ctx, tp(0)); !errors.As(err, &de) || de.Unfinished[tp(0)] != 5 {
			t.Fatalf("Revoke = %v, want a DrainError with %s unfinished at 5", err, tp(0))
		}
		epoch.Store(2)
		if err := src.Assign(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		<-newGate.entered
		// Now the old assignment's handler for offset 5 finishes.
		close(oldGate.release)
		await(t, time.Second, "the stale completion counted", func() bool { return m.sum(t, "tidemark.completions.stale") == 1 })
		time.Sleep(time.Second) // fake time: hundreds of commit intervals
		synctest.Wait()
		if off, _ := src.Committed(tp(0)); off != 5 {
			t.Fatalf("commit moved to %d on an old assignment's completion; want 5", off)
		}
		close(newGate.release)
		await(t, time.Second, "commit reaches the end", committedAt(src, 0, 20))
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLostCommitsNothing checks invariant 4: after Lost nothing is committed
// for the partition and its in-flight handlers' contexts are cancelled.
func TestLostCommitsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 50, 50)
		cancelled := make(chan error, 1)
		g := newGate(func(r runner.Record) bool { return r.Partition == 0 && r.Offset == 10 })
		h := func(ctx context.Context, rec runner.Record) error {
			if rec.Partition == 0 && rec.Offset == 10 {
				g.entered <- rec.Offset
				<-ctx.Done()
				cancelled <- ctx.Err()
				<-g.release // finish late, after the loss
			}
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.CommitInterval(2*time.Millisecond), runner.Order(runner.Unordered))
		started(t, r)
		ctx := context.Background()
		if err := src.Assign(ctx, tp(0), tp(1)); err != nil {
			t.Fatal(err)
		}
		<-g.entered
		await(t, time.Second, "partition 0 committed up to the blocked record", committedAt(src, 0, 10))
		before := len(src.Commits())
		if err := src.Lose(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-cancelled:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("handler ctx ended with %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the lost partition's handler ctx was not cancelled")
		}
		close(g.release)
		// Partition 1 keeps committing; partition 0 never again.
		src.Append(runner.Record{Topic: topic, Partition: 1, Offset: 50, Key: []byte("x")})
		await(t, time.Second, "partition 1 committed", committedAt(src, 1, 51))
		for _, c := range src.Commits()[before:] {
			if c.TP == tp(0) {
				t.Fatalf("committed %s@%d after it was lost", c.TP, c.Offset)
			}
		}
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestShutdownDrainsAndCommits checks invariant 8's runner part: in-flight
// handlers finish, the safe offsets are committed, the source is closed.
func TestShutdownDrainsAndCommits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 3, 100, 100)
		var inflight atomic.Int32
		var mu sync.Mutex
		handled := map[runner.TP]map[int64]bool{}
		h := func(ctx context.Context, rec runner.Record) error {
			inflight.Add(1)
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			if handled[rec.TP()] == nil {
				handled[rec.TP()] = map[int64]bool{}
			}
			handled[rec.TP()][rec.Offset] = true
			mu.Unlock()
			inflight.Add(-1)
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Concurrency(8), runner.CommitInterval(time.Hour))
		wait := started(t, r)
		assign(t, src, tp(0), tp(1), tp(2))
		await(t, 50*time.Millisecond, "handlers running", func() bool { return inflight.Load() > 0 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if n := inflight.Load(); n != 0 {
			t.Fatalf("%d handlers still running after Run returned", n)
		}
		// With a one-hour commit interval, the only commit is the final one:
		// for every partition it must be the first offset not handled (the
		// contiguous handled prefix; the drain waited for all in flight).
		if len(src.Commits()) == 0 {
			t.Fatal("no final commit")
		}
		mu.Lock()
		defer mu.Unlock()
		for p := range int32(3) {
			var want int64
			for handled[tp(p)][want] {
				want++
			}
			off, ok := src.Committed(tp(p))
			if want == 0 {
				// Nothing handled: at most the start offset may be committed.
				if ok && off != 0 {
					t.Fatalf("%s: nothing handled but committed %d", tp(p), off)
				}
				continue
			}
			if !ok || off != want {
				t.Fatalf("%s: final commit %d (%v), want %d, the handled prefix", tp(p), off, ok, want)
			}
		}
		if !src.Closed() {
			t.Fatal("source not closed")
		}
	})
}

// TestShutdownBudgetRunsOut: a handler that outlives the budget is
// cancelled, the safe prefix below it is committed, and the error names it.
func TestShutdownBudgetRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 10, 10)
		g := newGate(func(r runner.Record) bool { return r.Offset == 3 })
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 3 {
				g.entered <- 3
				<-ctx.Done() // honours ctx, but only when cancelled
				return ctx.Err()
			}
			return nil
		}), runner.CommitInterval(time.Hour))
		wait := started(t, r)
		assign(t, src, tp(0))
		<-g.entered
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := r.Shutdown(ctx)
		var de *runner.DrainError
		if !errors.As(err, &de) || de.Unfinished[tp(0)] != 3 {
			t.Fatalf("Shutdown = %v, want a DrainError naming %s at 3", err, tp(0))
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("DrainError does not match context.DeadlineExceeded")
		}
		if werr := wait(); !errors.As(werr, &de) {
			t.Fatalf("Run = %v, want the DrainError", werr)
		}
		if off, _ := src.Committed(tp(0)); off != 3 {
			t.Fatalf("final commit %d, want 3 (the first unfinished record)", off)
		}
	})
}

// TestRunContextCancelIsGraceful: ending Run's ctx drains and commits.
func TestRunContextCancelIsGraceful(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 100, 10)
		var handled atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			handled.Add(1)
			return nil
		}), runner.CommitInterval(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- r.Run(ctx) }()
		assign(t, src, tp(0))
		await(t, time.Second, "everything handled", func() bool { return handled.Load() == 100 })
		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if off, _ := src.Committed(tp(0)); off != 100 {
			t.Fatalf("committed %d, want 100", off)
		}
		if err := r.Run(context.Background()); !errors.Is(err, runner.ErrStopped) {
			t.Fatalf("second Run = %v, want ErrStopped", err)
		}
	})
}

// TestCommitFailuresNeverGoBackward checks invariant 2 with failing commits.
func TestCommitFailuresNeverGoBackward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 500, 50)
		src.FailCommits(5)
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			time.Sleep(time.Millisecond) // fake latency: the run spans many commit intervals
			return nil
		}), runner.CommitInterval(time.Millisecond))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "committed at the end", committedAt(src, 0, 500))
		await(t, time.Second, "committed at the end", committedAt(src, 1, 500))
		commits := src.Commits()
		if len(commits) == 0 || commits[0].Offset >= 500 {
			t.Fatalf("first acknowledged commit %v: the failed commits did not come while records were handled", commits[:min(1, len(commits))])
		}
		last := map[runner.TP]int64{}
		for _, c := range commits {
			if c.Offset < last[c.TP] {
				t.Fatalf("%s went backward from %d to %d", c.TP, last[c.TP], c.Offset)
			}
			last[c.TP] = c.Offset
		}
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSparseOffsetsAndPosition: the commit follows delivered offsets and
// reaches the fetch position past control records.
func TestSparseOffsetsAndPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		for _, off := range []int64{100, 103, 108} {
			src.Append(runner.Record{Topic: topic, Partition: 0, Offset: off, Key: []byte("k")})
		}
		g := newGate(func(r runner.Record) bool { return r.Offset == 108 })
		r := newRunner(t, src, runner.Handle(topic, g.handler), runner.Order(runner.Unordered), runner.CommitInterval(time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		<-g.entered
		await(t, time.Second, "commit 104 with 108 unfinished", committedAt(src, 0, 104))
		close(g.release)
		await(t, time.Second, "commit 109", committedAt(src, 0, 109))
	})
}

// TestLostWaitsForTheCommitInFlight: Lost is answered only after a commit
// built before the loss was answered, so a source cannot get the partition
// back and send that old offset under a new generation.
func TestLostWaitsForTheCommitInFlight(t *testing.T) {
	waitsForTheCommitInFlight(t, "Lose", func(src *runnertest.Source) error {
		return src.Lose(context.Background(), tp(0))
	})
}

// waitsForTheCommitInFlight: with a commit of t/0's assignment held in
// flight, what (act, which ends that assignment) does not return until the
// commit was answered.
func waitsForTheCommitInFlight(t *testing.T, what string, act func(src *runnertest.Source) error) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 10, 10)
		held, release := src.HoldCommits()
		defer release()
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
			runner.CommitInterval(time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		<-held // a commit of the assignment is in flight
		done := make(chan error, 1)
		go func() { done <- act(src) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("%s returned (%v) while a commit built before it was in flight", what, err)
		default:
		}
		release()
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s did not return after the commit was answered", what)
		}
	})
}

// TestFinalCommitFailureReported: a revoke and a shutdown whose final commit
// is not acknowledged say so, instead of returning as if it had been: the
// source (and the operator) learn that records will be delivered again.
func TestFinalCommitFailureReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 20, 5)
		var handled atomic.Int64
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
			handled.Add(1)
			return nil
		}), runner.CommitInterval(time.Hour)) // only the final commits
		wait := started(t, r)
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "all handled", func() bool { return handled.Load() == 40 })

		src.FailCommits(1)
		err := src.Revoke(context.Background(), tp(0))
		var fce *runner.FinalCommitError
		if !errors.As(err, &fce) || !errors.Is(err, runnertest.ErrInjected) {
			t.Fatalf("Revoke with a failing final commit = %v, want a *FinalCommitError wrapping the commit error", err)
		}
		if _, ok := src.Committed(tp(0)); ok {
			t.Fatal("a commit for the revoked partition was recorded although it failed")
		}

		src.FailCommits(1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = r.Shutdown(ctx)
		if !errors.As(err, &fce) {
			t.Fatalf("Shutdown with a failing final commit = %v, want a *FinalCommitError", err)
		}
		if werr := wait(); !errors.As(werr, &fce) {
			t.Fatalf("Run = %v, want the *FinalCommitError too", werr)
		}
	})
}

// TestRevokeDrainDoesNotEndANewerAssignment: a revoke drain waits on an
// in-flight record; the source then reports the partition assigned again
// (the runner drops the old assignment as lost). The drain belongs to the
// old assignment: when it finishes it must not revoke the new one, whose
// records must run. (The drain used to look its partitions up by name and
// revoke the new assignment, dropping every later batch as "not owned".)
func TestRevokeDrainDoesNotEndANewerAssignment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDriver()
		handled := make(chan int64, 10)
		r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 0 {
				<-ctx.Done() // in flight until its assignment is dropped
				return ctx.Err()
			}
			handled <- rec.Offset
			return nil
		}), runner.CommitInterval(time.Hour))
		wait := started(t, r)
		sink := d.sink(t)
		ctx := context.Background()
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0, Generation: 1}}); err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Fetched(ctx, []runner.Batch{batch(records(0, 0, 1, 1))}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // offset 0 is in flight
		revoked := make(chan error, 1)
		go func() { revoked <- sink.Revoked(ctx, []runner.TP{tp(0)}, time.Time{}) }()
		synctest.Wait() // the drain waits on offset 0
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0, Generation: 2}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-revoked:
			if err != nil {
				t.Fatalf("Revoked of the replaced assignment = %v, want nil", err)
			}
		default:
			t.Fatal("Revoked still waits after its assignment was replaced")
		}
		if _, err := sink.Fetched(ctx, []runner.Batch{batch(records(0, 0, 2, 2))}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := len(handled); n != 1 {
			t.Fatalf("the new assignment handled %d records, want 1 (offset 1; offset 0 blocks); stats %+v", n, r.Stats())
		}
		r.Close()
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReassignWaitsForTheCommitInFlight: an assignment that replaces one
// the runner still holds, without a Lost before it, drops the old one as
// lost; like Lost, it is answered only after a commit built for the old
// one was answered, so the source cannot send that commit under the new
// generation. (It used to be answered at once.)
func TestReassignWaitsForTheCommitInFlight(t *testing.T) {
	waitsForTheCommitInFlight(t, "the second Assign", func(src *runnertest.Source) error {
		return src.Assign(context.Background(), tp(0))
	})
}
