package shutdown_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
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

// drainer is a fakeRunner with ShutdownWithin, as *runner.Runner has.
type drainer struct{ *fakeRunner }

func (d drainer) ShutdownWithin(ctx context.Context, drainDeadline time.Time) error {
	d.record("shutdown-within", ctx, drainDeadline.Sub(d.start))
	if d.stop == nil {
		return nil
	}
	return d.stop(ctx)
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
				cl, err := stopOnce(t, drainer{&fakeRunner{start: start}}, start, tc.opts...)
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

// TestCoordinatorSplitsTheBudget: the drain ends at budget − reserves, the
// runner's ctx at budget − the closers' reserve, the closers' at the
// budget. (The runner's ctx ended at 80% of the budget, 16 s of 20 s, and
// its drain at 70% of that.)
func TestCoordinatorSplitsTheBudget(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name    string
		within  bool // the runner has ShutdownWithin
		opts    []shutdown.Option
		drainBy time.Duration // -1: Shutdown was called
		ctxEnd  time.Duration
		closed  time.Duration
	}{
		{"defaults", true, []shutdown.Option{shutdown.Budget(20 * s)}, 13 * s, 18 * s, 20 * s},
		{"defaults cut for a short budget", true, []shutdown.Option{shutdown.Budget(8 * s)}, 5200 * time.Millisecond, 7200 * time.Millisecond, 8 * s},
		{"Reserve", true, []shutdown.Option{shutdown.Budget(10 * s), shutdown.Reserve(3*s, s)}, 6 * s, 9 * s, 10 * s},
		{"no closers' reserve", true, []shutdown.Option{shutdown.Budget(10 * s), shutdown.Reserve(s, 0)}, 9 * s, 10 * s, 10 * s},
		{"a runner without ShutdownWithin", false, []shutdown.Option{shutdown.Budget(20 * s)}, -1, 18 * s, 20 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				f := &fakeRunner{start: start}
				var r shutdown.Runner = f
				if tc.within {
					r = drainer{f}
				}
				cl, err := stopOnce(t, r, start, tc.opts...)
				if err != nil {
					t.Fatalf("Stop: %v", err)
				}
				if f.drainBy != tc.drainBy || f.ctxEnd != tc.ctxEnd {
					t.Errorf("the runner's drain ends at %v and its ctx at %v, want %v and %v (-1: Shutdown, no drain deadline)",
						f.drainBy, f.ctxEnd, tc.drainBy, tc.ctxEnd)
				}
				if end := cl.at + cl.left; end != tc.closed {
					t.Errorf("the closers' ctx ends at %v, want %v", end, tc.closed)
				}
			})
		})
	}
}

// TestCoordinatorClosersGetTheirReserve: a runner that uses all of its time
// — or ignores its ctx and runs on — leaves the closers their reserve: they
// are called when the runner's part ends, with the reserve left, and Stop
// reports the runner's overrun (exit 3). (The closers got 4 s of a 20 s
// budget, not 2 s; behind a runner running past its ctx they waited for it
// and got a ctx already ended.)
func TestCoordinatorClosersGetTheirReserve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		overrun time.Duration // how long the runner runs on past its ctx
	}{
		{"runner used all its time", 0},
		{"runner ignores its ctx", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				returned := make(chan struct{})
				defer func() { <-returned }() // the bubble's clock runs on while it waits
				f := &fakeRunner{start: start, stop: func(ctx context.Context) error {
					defer close(returned)
					<-ctx.Done()
					time.Sleep(tc.overrun)
					return ctx.Err()
				}}
				cl, err := stopOnce(t, drainer{f}, start, shutdown.Budget(20*time.Second))
				if cl.at != 18*time.Second || cl.left != shutdown.DefaultClosingReserve {
					t.Errorf("closers called %v after the signal with %v left, want at 18s with the %v reserve",
						cl.at, cl.left, shutdown.DefaultClosingReserve)
				}
				if code := shutdown.ExitCode(err); code != 3 {
					t.Errorf("Stop = %v (exit %d), want exit 3: the runner ran out of time", err, code)
				}
			})
		})
	}
}

// TestCoordinatorRefusesReserves: reserves that leave the drain nothing,
// a non-positive final-commit reserve and a negative closers' one are
// errors naming them.
func TestCoordinatorRefusesReserves(t *testing.T) {
	for _, tc := range []struct {
		finalCommit, closing time.Duration
		want                 string
	}{
		{8 * time.Second, 2 * time.Second, "leave nothing of the 10s budget"},
		{15 * time.Second, 0, "leave nothing of the 10s budget"},
		{0, time.Second, "final commit's 0s is not positive"},
		{time.Second, -time.Second, "closers' -1s is negative"},
		// Their sum overflows to a negative duration: still refused, not
		// a drain deadline centuries before the signal.
		{math.MaxInt64, time.Second, "leave nothing of the 10s budget"},
		{time.Second, math.MaxInt64, "leave nothing of the 10s budget"},
		{math.MaxInt64 / 2, math.MaxInt64/2 + 2, "leave nothing of the 10s budget"},
	} {
		_, err := shutdown.NewCoordinator(&fakeRunner{}, shutdown.Budget(10*time.Second), shutdown.Reserve(tc.finalCommit, tc.closing))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Reserve(%v, %v) of 10s: NewCoordinator returned %v, want an error saying %q", tc.finalCommit, tc.closing, err, tc.want)
		}
	}
	if _, err := shutdown.NewCoordinator(&fakeRunner{}, shutdown.Budget(-time.Second)); err == nil || !strings.Contains(err.Error(), "Budget -1s is not positive") {
		t.Errorf("Budget(-1s): NewCoordinator returned %v, want an error naming it", err)
	}
}

// TestCoordinatorOrder: readiness goes off before the runner's Shutdown,
// the closers run in order, each with a deadline, and the stop is clean.
func TestCoordinatorOrder(t *testing.T) {
	f := &fakeRunner{start: time.Now()}
	p := shutdown.NewProbes(f, 0)
	p.Started()
	var readyAtShutdown []bool
	f.stop = func(context.Context) error {
		ok, _ := p.Ready()
		readyAtShutdown = append(readyAtShutdown, ok)
		return nil
	}
	var order []string
	closer := func(name string) shutdown.Closer {
		return shutdown.Closer{Name: name, Close: func(ctx context.Context) error {
			order = append(order, name)
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("closer %s got no deadline", name)
			}
			return nil
		}}
	}
	c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(10*time.Second), shutdown.WithProbes(p),
		shutdown.Close(closer("http"), closer("db"), closer("telemetry")))
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	err = c.Wait(context.Background(), sigs)
	if err != nil || shutdown.ExitCode(err) != 0 {
		t.Fatalf("Wait = %v (exit %d), want a clean stop", err, shutdown.ExitCode(err))
	}
	if len(readyAtShutdown) != 1 || readyAtShutdown[0] {
		t.Fatalf("readiness at the runner's ShutdownWithin: %v, want [false] (off before the drain)", readyAtShutdown)
	}
	if got := strings.Join(f.calls, ","); got != "shutdown-within" {
		t.Fatalf("runner calls %s, want shutdown-within alone", got)
	}
	if strings.Join(order, ",") != "http,db,telemetry" {
		t.Fatalf("closers ran %v, want in order", order)
	}
}

func TestCoordinatorDrainIncomplete(t *testing.T) {
	f := &fakeRunner{stop: func(ctx context.Context) error {
		return &runner.DrainError{Unfinished: map[runner.TP]int64{{Topic: topic, Partition: 2}: 41}}
	}}
	c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Stop(nil)
	if code := shutdown.ExitCode(err); code != 3 || !strings.Contains(err.Error(), "t/2@41") {
		t.Fatalf("Stop = %v (exit %d), want exit 3 naming t/2@41", err, code)
	}
}

// TestSecondSignalStopsAtOnce: a second signal during the drain closes the
// runner and returns ErrForced when it comes, not at the budget's end.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{stop: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}
		c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		sigs := make(chan os.Signal, 2)
		sigs <- syscall.SIGTERM
		go func() {
			time.Sleep(20 * time.Millisecond)
			sigs <- syscall.SIGINT
		}()
		start := time.Now()
		err = c.Wait(context.Background(), sigs)
		if !errors.Is(err, shutdown.ErrForced) || shutdown.ExitCode(err) != 4 {
			t.Fatalf("Wait = %v, want ErrForced (exit 4)", err)
		}
		f.mu.Lock()
		calls := strings.Join(f.calls, ",")
		f.mu.Unlock()
		if took := time.Since(start); took != 20*time.Millisecond || calls != "shutdown-within,close" {
			t.Fatalf("Wait returned %v after the first signal with runner calls %s, want 20ms (at the second) and a Close", took, calls)
		}
	})
}

// TestExitCodes: each way a stop can end maps to its documented status.
func TestExitCodes(t *testing.T) {
	drain := &runner.DrainError{Unfinished: map[runner.TP]int64{{Topic: "t", Partition: 0}: 5}}
	final := &runner.FinalCommitError{Err: errors.New("coordinator unavailable")}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"clean", nil, 0},
		{"drain budget ran out", drain, 3},
		{"final commit failed", final, 3},
		{"both", errors.Join(drain, final), 3},
		{"forced", fmt.Errorf("stop: %w", shutdown.ErrForced), 4},
		{"other", errors.New("source failed"), 1},
	} {
		if got := shutdown.ExitCode(c.err); got != c.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
}

// TestCoordinatorWithARealRunner: over a *runner.Runner the split holds end
// to end: a handler that runs past the drain is cancelled at budget −
// reserves (after the final commit, which commits the records before it),
// the stop exits 3 naming it, and the closers get what is left: the
// reserves the final commit did not use.
func TestCoordinatorWithARealRunner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		for off := range int64(3) {
			src.Append(runner.Record{Topic: topic, Partition: 0, Offset: off, Key: []byte{byte('a' + off)}})
		}
		var start time.Time
		cancelledAt := make(chan time.Duration, 1)
		r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 2 {
				<-ctx.Done()
				cancelledAt <- time.Since(start)
				return ctx.Err()
			}
			return nil
		}), runner.CommitInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(context.Background()) }()
		if err := src.Assign(context.Background(), runner.TP{Topic: topic}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // 0 and 1 handled, 2 running
		start = time.Now()
		cl, err := stopOnce(t, r, start, shutdown.Budget(10*time.Second), shutdown.Reserve(3*time.Second, time.Second))
		var de *runner.DrainError
		if !errors.As(err, &de) || de.Unfinished[runner.TP{Topic: topic}] != 2 || shutdown.ExitCode(err) != 3 {
			t.Errorf("Stop = %v (exit %d), want exit 3 with a *DrainError naming t/0@2", err, shutdown.ExitCode(err))
		}
		if at := <-cancelledAt; at != 6*time.Second {
			t.Errorf("the handler past the drain was cancelled %v after the signal, want 6s (10s − 3s − 1s)", at)
		}
		if cl.at != 6*time.Second || cl.left != 4*time.Second {
			t.Errorf("closers called %v after the signal with %v left, want at 6s with 4s", cl.at, cl.left)
		}
		if off, _ := src.Committed(runner.TP{Topic: topic}); off != 2 {
			t.Errorf("final commit %d, want 2 (the first unfinished record)", off)
		}
		<-runErr
	})
}
