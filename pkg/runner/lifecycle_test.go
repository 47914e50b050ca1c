package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestFinalCommitUsesShutdownsBudget: when Shutdown's ctx ends while the
// final commit is on its way, the commit has had what was left of that
// budget (not a fresh CommitTimeout) and Run reports it as a
// *FinalCommitError, as documented. (Run used to return nil: Shutdown gave
// up, called Close, and the loop returned as for a plain Close.)
func TestFinalCommitUsesShutdownsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDriver()
		commitDeadline := make(chan time.Time, 1)
		d.commitFn = func(ctx context.Context, _ []runner.Offset) error {
			dl, _ := ctx.Deadline()
			commitDeadline <- dl
			<-ctx.Done() // the broker never answers
			return ctx.Err()
		}
		r := newRunner(t, d, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
			runner.CommitInterval(time.Hour), runner.CommitTimeout(time.Minute))
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(context.Background()) }()
		sink := d.sink(t)
		ctx := context.Background()
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Fetched(ctx, []runner.Batch{batch(records(0, 0, 3, 3))}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // all three handled
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		budgetEnd, _ := sctx.Deadline()
		serr := r.Shutdown(sctx)
		if !errors.Is(serr, context.DeadlineExceeded) {
			t.Fatalf("Shutdown = %v, want its ctx's deadline exceeded", serr)
		}
		if dl := <-commitDeadline; dl.IsZero() || dl.After(budgetEnd) {
			t.Fatalf("the final commit's deadline is %v, past Shutdown's %v", dl, budgetEnd)
		}
		err := <-runErr
		var fce *runner.FinalCommitError
		if !errors.As(err, &fce) {
			t.Fatalf("Run = %v, want a *FinalCommitError: its final commit was never acknowledged", err)
		}
	})
}

// TestCloseDuringShutdownReportsTheFinalCommit: Close while a shutdown
// drains means the final commit is never sent; Run says so.
func TestCloseDuringShutdownReportsTheFinalCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDriver()
		r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			<-ctx.Done()
			return ctx.Err()
		}), runner.CommitInterval(time.Hour))
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(context.Background()) }()
		sink := d.sink(t)
		ctx := context.Background()
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Fetched(ctx, []runner.Batch{batch(records(0, 0, 1, 1))}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		serr := make(chan error, 1)
		go func() { serr <- r.Shutdown(ctx) }() // no deadline: waits for the handler
		synctest.Wait()
		r.Close()
		var fce *runner.FinalCommitError
		if err := <-runErr; !errors.As(err, &fce) {
			t.Fatalf("Run = %v, want a *FinalCommitError", err)
		}
		if err := <-serr; !errors.As(err, &fce) {
			t.Fatalf("Shutdown = %v, want Run's *FinalCommitError", err)
		}
	})
}

// TestStopBeforeRun: Shutdown or Close before Run stops the runner, as
// net/http's Shutdown stops a Server before Serve: Run then returns
// ErrStopped at once without starting the source, so a SIGTERM during
// start-up is not lost. (Run used to run until closed after a Shutdown, and
// to start the source, joining the group, after a Close.)
func TestStopBeforeRun(t *testing.T) {
	for _, stop := range []string{"Shutdown", "Close"} {
		t.Run(stop, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newDriver()
				r := newRunner(t, d, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }))
				if stop == "Shutdown" {
					if err := r.Shutdown(context.Background()); err != nil {
						t.Fatalf("Shutdown before Run = %v, want nil", err)
					}
				} else {
					r.Close()
				}
				runErr := make(chan error, 1)
				go func() { runErr <- r.Run(context.Background()) }()
				synctest.Wait()
				select {
				case err := <-runErr:
					if !errors.Is(err, runner.ErrStopped) {
						t.Errorf("Run after %s = %v, want ErrStopped", stop, err)
					}
				default:
					t.Errorf("Run after %s is still running", stop)
					r.Close()
					<-runErr
				}
				d.mu.Lock()
				runs := d.runs
				d.mu.Unlock()
				if runs != 0 {
					t.Errorf("Run after %s started the source", stop)
				}
				if err := r.Shutdown(context.Background()); err != nil {
					t.Errorf("a second Shutdown = %v, want nil", err)
				}
			})
		})
	}
}
