package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestShutdownAndRunsCtxBothStop: one SIGTERM both ends Run's ctx
// (signal.NotifyContext) and calls ShutdownWithin (shutdown.Coordinator),
// in either order as the poll loop sees them. Whatever the order, the
// drain ends at the earlier of the two drain deadlines (DrainBudget after
// Run's ctx ended, ShutdownWithin's), and the final commit is bounded by
// Shutdown's ctx. (The first stop was kept and the second ignored: with
// Run's ctx first, the drain ran for DrainBudget and the commit had no
// deadline but CommitTimeout's, so at Shutdown's 9 s the runner was closed
// with no final commit; with ShutdownWithin first, a shorter DrainBudget
// was ignored.)
func TestShutdownAndRunsCtxBothStop(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ctxFirst    bool
		drainBudget time.Duration
		want        commitSeen
	}{
		{"ctx first, Shutdown's drain earlier", true, 10 * time.Second, commitSeen{6 * time.Second, 9 * time.Second}},
		{"ctx first, DrainBudget earlier", true, 2 * time.Second, commitSeen{2 * time.Second, 9 * time.Second}},
		{"Shutdown first, Shutdown's drain earlier", false, 10 * time.Second, commitSeen{6 * time.Second, 9 * time.Second}},
		{"Shutdown first, DrainBudget earlier", false, 2 * time.Second, commitSeen{2 * time.Second, 9 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newDriver()
				var start time.Time
				seen := make(chan commitSeen, 1)
				d.commitFn = func(ctx context.Context, _ []runner.Offset) error {
					c := commitSeen{at: time.Since(start), deadline: -1}
					if dl, ok := ctx.Deadline(); ok {
						c.deadline = dl.Sub(start)
					}
					seen <- c
					return nil
				}
				h := runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
					if rec.Offset == 2 {
						<-ctx.Done() // runs past the drain
						return ctx.Err()
					}
					return nil
				})
				r := newRunner(t, d, h, runner.Order(runner.Unordered), runner.CommitInterval(time.Hour),
					runner.DrainBudget(tc.drainBudget))
				runCtx, signalled := context.WithCancel(context.Background()) // signal.NotifyContext's
				defer signalled()
				runErr := make(chan error, 1)
				go func() { runErr <- r.Run(runCtx) }()
				sink := d.sink(t)
				ctx := context.Background()
				if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
					t.Fatal(err)
				}
				if _, err := sink.Fetched(ctx, []runner.Batch{batch(records(0, 0, 3, 3))}); err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // 0 and 1 handled, 2 running
				start = time.Now()
				shutCtx, cancel := context.WithDeadline(context.Background(), start.Add(9*time.Second))
				defer cancel()
				shutErr := make(chan error, 1)
				shutdown := func() { shutErr <- r.ShutdownWithin(shutCtx, start.Add(6*time.Second)) }
				if tc.ctxFirst {
					signalled()
					synctest.Wait() // the loop began the stop of Run's ctx
					go shutdown()
				} else {
					go shutdown()
					synctest.Wait() // the loop began ShutdownWithin's stop
					signalled()
				}
				err := <-shutErr
				<-runErr
				select {
				case c := <-seen:
					if c != tc.want {
						t.Errorf("final commit sent at %v with a deadline at %v, want at %v (the earlier drain end) with %v (Shutdown's ctx)",
							c.at, c.deadline, tc.want.at, tc.want.deadline)
					}
				default:
					t.Errorf("no final commit was sent (ShutdownWithin = %v)", err)
				}
			})
		})
	}
}
