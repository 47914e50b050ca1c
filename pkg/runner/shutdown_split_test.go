package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// commitSeen is when the final commit was sent, measured from the start of
// the shutdown, and the deadline it got, measured from there too (-1: none).
type commitSeen struct{ at, deadline time.Duration }

// shutdownSplit runs a runner over a driver with records 0..2 of t/0
// fetched, 0 and 1 handled and 2 running until its ctx ends, then stops it
// with stop (called at the start of the shutdown) and returns when the
// final commit was sent and with what deadline, and what stop returned.
func shutdownSplit(t *testing.T, opts []runner.Option, stop func(r *runner.Runner, start time.Time) error) (commitSeen, error) {
	t.Helper()
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
	opts = append([]runner.Option{h, runner.Order(runner.Unordered), runner.CommitInterval(time.Hour)}, opts...)
	r := newRunner(t, d, opts...)
	wait := started(t, r)
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
	err := stop(r, start)
	_ = wait()
	select {
	case c := <-seen:
		return c, err
	default:
		t.Fatalf("no final commit was sent (stop returned %v)", err)
		return commitSeen{}, err
	}
}

// TestShutdownSplitsItsDeadline: Shutdown with a deadline D ends the drain
// at D − min(CommitTimeout, half the time left) and gives the final commit
// the rest. (It ended the drain at 70% of the time left: 7 s and 2.1 s
// here.)
func TestShutdownSplitsItsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name          string
		commitTimeout time.Duration
		budget        time.Duration
		drain         time.Duration
	}{
		{"CommitTimeout reserved", 2 * time.Second, 10 * time.Second, 8 * time.Second},
		{"half of a short budget", 10 * time.Second, 3 * time.Second, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, err := shutdownSplit(t, []runner.Option{runner.CommitTimeout(tc.commitTimeout)}, func(r *runner.Runner, _ time.Time) error {
					ctx, cancel := context.WithTimeout(context.Background(), tc.budget)
					defer cancel()
					return r.Shutdown(ctx)
				})
				if want := (commitSeen{at: tc.drain, deadline: tc.budget}); c != want {
					t.Errorf("final commit sent at %v with a deadline at %v, want at %v (the drain's end) with %v (Shutdown's)",
						c.at, c.deadline, want.at, want.deadline)
				}
				var de *runner.DrainError
				if !errors.As(err, &de) || de.Unfinished[tp(0)] != 2 {
					t.Errorf("Shutdown = %v, want a *DrainError naming %s at 2", err, tp(0))
				}
			})
		})
	}
}

// TestShutdownWithinEndsTheDrainWhenTold: ShutdownWithin drains until the
// deadline it is given, then gives the final commit CommitTimeout, cut to
// what is left of ctx; a drain deadline past ctx's is ctx's.
func TestShutdownWithinEndsTheDrainWhenTold(t *testing.T) {
	for _, tc := range []struct {
		name          string
		commitTimeout time.Duration
		budget        time.Duration // Shutdown's ctx; 0: no deadline
		drainBy       time.Duration
		want          commitSeen
	}{
		{"commit cut to ctx", 10 * time.Second, 10 * time.Second, 4 * time.Second, commitSeen{4 * time.Second, 10 * time.Second}},
		{"commit bounded by CommitTimeout", time.Second, 10 * time.Second, 4 * time.Second, commitSeen{4 * time.Second, 5 * time.Second}},
		{"no ctx deadline", time.Second, 0, 4 * time.Second, commitSeen{4 * time.Second, 5 * time.Second}},
		{"drain deadline past ctx's", 10 * time.Second, 3 * time.Second, time.Minute, commitSeen{3 * time.Second, 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, _ := shutdownSplit(t, []runner.Option{runner.CommitTimeout(tc.commitTimeout)}, func(r *runner.Runner, start time.Time) error {
					ctx := context.Background()
					if tc.budget > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tc.budget)
						defer cancel()
					}
					return r.ShutdownWithin(ctx, start.Add(tc.drainBy))
				})
				if c != tc.want {
					t.Errorf("final commit sent at %v with a deadline at %v, want at %v with %v", c.at, c.deadline, tc.want.at, tc.want.deadline)
				}
			})
		})
	}
}
