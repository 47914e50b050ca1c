package shutdown_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// fakeRunner records the deadlines the coordinator gave it, measured from
// start. Its stop (nil: return at once) runs in Shutdown and ShutdownWithin.
type fakeRunner struct {
	start time.Time
	stop  func(ctx context.Context) error

	mu      sync.Mutex
	drainBy time.Duration // ShutdownWithin's drain deadline; -1: Shutdown was called
	ctxEnd  time.Duration // the deadline of Shutdown's ctx; -1: none
	calls   []string
}

func (f *fakeRunner) Stats() runner.Stats { return runner.Stats{LoopAt: time.Now()} }

func (f *fakeRunner) record(call string, ctx context.Context, drainBy time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	f.drainBy, f.ctxEnd = drainBy, -1
	if d, ok := ctx.Deadline(); ok {
		f.ctxEnd = d.Sub(f.start)
	}
}

func (f *fakeRunner) Shutdown(ctx context.Context) error {
	f.record("shutdown", ctx, -1)
	if f.stop == nil {
		return nil
	}
	return f.stop(ctx)
}

func (f *fakeRunner) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "close")
	return nil
}

// closerLeft is a closer that records how much of its ctx was left, and
// when it was called, both measured from start.
type closerLeft struct {
	start    time.Time
	at, left time.Duration
	called   bool
}

func (c *closerLeft) closer() shutdown.Closer {
	return shutdown.Closer{Name: "probe", Close: func(ctx context.Context) error {
		c.called, c.at = true, time.Since(c.start)
		if d, ok := ctx.Deadline(); ok {
			c.left = time.Until(d)
		}
		return nil
	}}
}

// stopOnce builds a coordinator for r with opts and a recording closer,
// stops it and returns the closer's record and Stop's result.
func stopOnce(t *testing.T, r shutdown.Runner, start time.Time, opts ...shutdown.Option) (*closerLeft, error) {
	t.Helper()
	cl := &closerLeft{start: start}
	c, err := shutdown.NewCoordinator(r, append(opts, shutdown.Close(cl.closer()))...)
	if err != nil {
		t.Fatalf("NewCoordinator: %v", err)
	}
	err = c.Stop(nil)
	if !cl.called {
		t.Fatal("the closer was not called")
	}
	return cl, err
}

// TestCoordinatorReadsTheBudgetFromEnv: without a Budget option the
// coordinator's budget is TIDEMARK_SHUTDOWN_BUDGET; a Budget option wins
// over it. (Only an explicit BudgetFromEnv call read it: the closers' ctx
// ended at the default 20 s.)
func TestCoordinatorReadsTheBudgetFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []shutdown.Option
		want time.Duration
	}{
		{"from the environment", nil, 7 * time.Second},
		{"Budget wins", []shutdown.Option{shutdown.Budget(11 * time.Second)}, 11 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(shutdown.BudgetEnv, "7s")
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				cl, err := stopOnce(t, &fakeRunner{start: start}, start, tc.opts...)
				if err != nil {
					t.Fatalf("Stop: %v", err)
				}
				if end := cl.at + cl.left; end != tc.want {
					t.Errorf("the closers' ctx ends %v after the signal, want the %v budget", end, tc.want)
				}
			})
		})
	}
}

// TestCoordinatorRefusesABadBudgetEnv: a bad TIDEMARK_SHUTDOWN_BUDGET is
// NewCoordinator's error, naming the variable and the value — unless a
// Budget option is given, and the variable is not read.
func TestCoordinatorRefusesABadBudgetEnv(t *testing.T) {
	for _, bad := range []string{"soon", "-5s", "0"} {
		t.Setenv(shutdown.BudgetEnv, bad)
		_, err := shutdown.NewCoordinator(&fakeRunner{})
		if err == nil || !strings.Contains(err.Error(), shutdown.BudgetEnv) || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("%s=%q: NewCoordinator returned %v, want an error naming the variable and the value", shutdown.BudgetEnv, bad, err)
		}
		if _, err := shutdown.NewCoordinator(&fakeRunner{}, shutdown.Budget(time.Second)); err != nil {
			t.Errorf("%s=%q with Budget(1s): NewCoordinator returned %v, want nil (Budget wins)", shutdown.BudgetEnv, bad, err)
		}
	}
}

// TestBudgetFromEnv: unset or empty is DefaultBudget; a bad value is an
// error naming the variable.
func TestBudgetFromEnv(t *testing.T) {
	t.Setenv(shutdown.BudgetEnv, "")
	if d, err := shutdown.BudgetFromEnv(); err != nil || d != shutdown.DefaultBudget {
		t.Fatalf("empty: %v %v", d, err)
	}
	os.Unsetenv(shutdown.BudgetEnv) // t.Setenv restores it
	if d, err := shutdown.BudgetFromEnv(); err != nil || d != shutdown.DefaultBudget {
		t.Fatalf("unset: %v %v", d, err)
	}
	t.Setenv(shutdown.BudgetEnv, "25s")
	if d, err := shutdown.BudgetFromEnv(); err != nil || d != 25*time.Second {
		t.Fatalf("25s: %v %v", d, err)
	}
	for _, bad := range []string{"soon", "-5s", "0"} {
		t.Setenv(shutdown.BudgetEnv, bad)
		if _, err := shutdown.BudgetFromEnv(); err == nil || !strings.Contains(err.Error(), shutdown.BudgetEnv) {
			t.Fatalf("%q: err %v, want one naming the variable", bad, err)
		}
	}
}
