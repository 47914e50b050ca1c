package shutdown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Runner is what the coordinator and the probes need from a
// *runner.Runner.
type Runner interface {
	Shutdown(ctx context.Context) error
	Close() error
	Stats() runner.Stats
}

// Drainer is implemented by a Runner whose drain can end before its
// Shutdown ctx does, as *runner.Runner's does (runner.Runner.ShutdownWithin).
// The coordinator calls ShutdownWithin when its Runner has it, so the drain
// ends where Reserve says; otherwise it calls Shutdown with the same ctx
// (ending at the budget less the closers' reserve), and the runner splits
// that ctx itself.
type Drainer interface {
	ShutdownWithin(ctx context.Context, drainDeadline time.Time) error
}

var _ Drainer = (*runner.Runner)(nil)

// BudgetEnv is the environment variable NewCoordinator reads the budget
// from when no Budget option is given.
const BudgetEnv = "TIDEMARK_SHUTDOWN_BUDGET"

// DefaultBudget is the shutdown budget when neither Budget nor
// TIDEMARK_SHUTDOWN_BUDGET sets one.
const DefaultBudget = 20 * time.Second

// The reserves without a Reserve option: DefaultFinalCommitReserve for the
// final commit and leaving the group, DefaultClosingReserve for the
// closers, each cut to a quarter (the final commit's) and a tenth (the
// closers') of a budget under 20s, so that any positive budget leaves the
// drain more than half of it. With the default 20s budget: 13s of drain,
// 5s for the final commit, 2s for the closers.
const (
	DefaultFinalCommitReserve = 5 * time.Second
	DefaultClosingReserve     = 2 * time.Second
)

// BudgetFromEnv reads TIDEMARK_SHUTDOWN_BUDGET (a Go duration such as "25s").
// It returns DefaultBudget when the variable is unset or empty, and an error
// naming the variable and the value when it is not a positive duration.
// NewCoordinator calls it when no Budget option is given; call it yourself
// to fail on a bad value, or log the budget, before anything else starts.
func BudgetFromEnv() (time.Duration, error) {
	v, ok := os.LookupEnv(BudgetEnv)
	if !ok || v == "" {
		return DefaultBudget, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("shutdown: %s=%q is not a positive duration (e.g. 25s)", BudgetEnv, v)
	}
	return d, nil
}

// Closer is one thing to close after the runner stopped, in order.
type Closer struct {
	Name  string
	Close func(ctx context.Context) error
}

// Coordinator runs the graceful stop. Build it with NewCoordinator.
type Coordinator struct {
	r      Runner
	probes *Probes
	// budget is the whole stop, from the signal to Stop's return; the
	// drain gets what finalCommit and closing do not reserve.
	budget, finalCommit, closing time.Duration
	budgetSet, reserveSet        bool
	closers                      []Closer
	log                          *slog.Logger
}

// Option configures a Coordinator.
type Option func(*Coordinator)

// Budget sets the whole shutdown budget: the time from the signal to Stop's
// return, after which the program exits. Reserve says how it is split. Budget
// wins over TIDEMARK_SHUTDOWN_BUDGET, which is read only when Budget is not
// given; without either, DefaultBudget.
func Budget(d time.Duration) Option {
	return func(c *Coordinator) { c.budget, c.budgetSet = d, true }
}

// Reserve splits the budget: the runner's drain ends finalCommit+closing
// before the budget does; finalCommit is then the final commit's and
// leaving the group's (each commit request also bounded by the runner's
// CommitTimeout), and the last closing is the closers'. What the drain or
// the final commit do not use goes to what follows. finalCommit must be
// positive, closing not negative, and together less than the budget: else
// NewCoordinator returns an error. Default DefaultFinalCommitReserve and
// DefaultClosingReserve, cut for a budget under 20s as they say.
func Reserve(finalCommit, closing time.Duration) Option {
	return func(c *Coordinator) { c.finalCommit, c.closing, c.reserveSet = finalCommit, closing, true }
}

// WithProbes makes the coordinator turn readiness off before the drain.
func WithProbes(p *Probes) Option { return func(c *Coordinator) { c.probes = p } }

// Close appends closers, run in order after the runner stopped.
func Close(cs ...Closer) Option { return func(c *Coordinator) { c.closers = append(c.closers, cs...) } }

// Logger sets the logger. Default slog.Default().
func Logger(l *slog.Logger) Option { return func(c *Coordinator) { c.log = l } }

// NewCoordinator returns a coordinator for r. Without a Budget option it
// reads TIDEMARK_SHUTDOWN_BUDGET (BudgetFromEnv). A bad value of that
// variable, a non-positive budget and reserves that do not leave the drain
// some of the budget are errors naming them.
func NewCoordinator(r Runner, opts ...Option) (*Coordinator, error) {
	c := &Coordinator{r: r, log: slog.Default()}
	for _, o := range opts {
		o(c)
	}
	if r == nil {
		return nil, errors.New("shutdown: nil runner")
	}
	if !c.budgetSet {
		d, err := BudgetFromEnv()
		if err != nil {
			return nil, err
		}
		c.budget = d
	}
	if c.budget <= 0 {
		return nil, fmt.Errorf("shutdown: Budget %v is not positive", c.budget)
	}
	if !c.reserveSet {
		c.finalCommit = min(DefaultFinalCommitReserve, c.budget/4)
		c.closing = min(DefaultClosingReserve, c.budget/10)
	}
	what := "Reserve"
	if !c.reserveSet {
		what = "the default reserves" // of a budget under 4ns
	}
	switch {
	case c.finalCommit <= 0:
		return nil, fmt.Errorf("shutdown: %s: the final commit's %v is not positive", what, c.finalCommit)
	case c.closing < 0:
		return nil, fmt.Errorf("shutdown: %s: the closers' %v is negative", what, c.closing)
	case c.finalCommit >= c.budget || c.closing >= c.budget || c.finalCommit >= c.budget-c.closing:
		// Not finalCommit+closing >= budget: the sum can overflow to a
		// negative duration, and the drain deadline lie centuries
		// before the signal.
		return nil, fmt.Errorf("shutdown: %s: %v for the final commit and %v for closing leave nothing of the %v budget for the drain",
			what, c.finalCommit, c.closing, c.budget)
	}
	return c, nil
}

// ErrForced is returned (wrapped) when a second signal stopped the service
// at once.
var ErrForced = errors.New("shutdown: stopped at once by a second signal")

// Wait blocks until a signal arrives on sigs or ctx is done, then stops the
// service as Stop does. It returns what Stop returns; use ExitCode for the
// process's exit status. A nil sigs leaves ctx alone to ask for the stop.
// Closing sigs asks for it too, as a signal does (closing a channel is
// Go's way to say "stop" to all who wait on it); a closed channel is never
// a second signal: the stop that follows is graceful and cannot be forced.
func (c *Coordinator) Wait(ctx context.Context, sigs <-chan os.Signal) error {
	select {
	case sig, ok := <-sigs:
		if !ok {
			c.log.Info("signal channel closed: stopping", "budget", c.budget)
			return c.Stop(nil)
		}
		c.log.Info("signal received: stopping", "signal", signalName(sig), "budget", c.budget)
	case <-ctx.Done():
		c.log.Info("context done: stopping", "budget", c.budget)
	}
	return c.Stop(sigs)
}

// Stop runs the graceful stop now, within the budget from now: readiness
// off; the runner's drain until budget − final-commit reserve − closing
// reserve, its final commit and leaving the group until budget − closing
// reserve; then the closers in order, with a ctx ending with the budget. A
// runner still stopping at its deadline (one whose Shutdown does not honour
// its ctx: a *runner.Runner does) is Closed and left behind, so the closers
// still get their reserve. A signal on sigs (may be nil) during the
// runner's stop calls runner.Close and returns ErrForced at once; sigs
// closed, before or during the stop, is no signal (as nil).
//
// Stop returns nil when everything finished in time; otherwise the errors
// joined (a *runner.DrainError names the partitions left unfinished). It
// returns within the budget when the closers honour their ctx.
func (c *Coordinator) Stop(sigs <-chan os.Signal) error {
	start := time.Now()
	if c.probes != nil {
		c.probes.Draining()
	}
	end := start.Add(c.budget)
	runnerEnd := end.Add(-c.closing)
	drainEnd := runnerEnd.Add(-c.finalCommit)
	c.log.Info("stopping: draining", "drain_until", drainEnd, "final_commit_until", runnerEnd, "closing_until", end)
	runCtx, cancel := context.WithDeadline(context.Background(), runnerEnd)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if d, ok := c.r.(Drainer); ok {
			done <- d.ShutdownWithin(runCtx, drainEnd)
			return
		}
		done <- c.r.Shutdown(runCtx)
	}()
	// The runner's deadline is enforced here too, so that the closers'
	// reserve does not depend on the Runner honouring its ctx. A
	// *runner.Runner returns at that deadline too; whichever is seen
	// first, the result is a deadline error (exit 3) and Close was called.
	late := time.NewTimer(time.Until(runnerEnd))
	defer late.Stop()
	var errs []error
	runnerErr := func(err error) {
		if err != nil {
			errs = append(errs, &runnerError{err})
		}
	}
wait:
	for {
		select {
		case err := <-done:
			runnerErr(err)
			break wait
		case <-late.C:
			select {
			case err := <-done: // returned at that instant: its answer says more
				runnerErr(err)
			default:
				_ = c.r.Close()
				errs = append(errs, &runnerError{fmt.Errorf("still stopping at its deadline (%v after the signal), closed: %w",
					runnerEnd.Sub(start), context.DeadlineExceeded)})
			}
			break wait
		case sig, ok := <-sigs:
			if !ok {
				sigs = nil // closed: no second signal can come
				continue
			}
			c.log.Warn("second signal: stopping at once", "signal", signalName(sig))
			_ = c.r.Close()
			return ErrForced
		}
	}
	c.log.Info("runner stopped", "took", time.Since(start).Round(time.Millisecond))
	closeCtx, cancelClose := context.WithDeadline(context.Background(), end)
	defer cancelClose()
	for _, cl := range c.closers {
		if err := cl.Close(closeCtx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown: closing %s: %w", cl.Name, err))
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		c.log.Error("stopped with errors", "took", time.Since(start).Round(time.Millisecond), "err", err)
	} else {
		c.log.Info("stopped cleanly", "took", time.Since(start).Round(time.Millisecond))
	}
	return err
}

// signalName is sig's name for the log; a nil os.Signal sent on the
// channel has none.
func signalName(sig os.Signal) string {
	if sig == nil {
		return "<nil>"
	}
	return sig.String()
}

// runnerError is the runner's part of Stop's error, kept apart from the
// closers' so that ExitCode reads a deadline in it as records left to the
// next owner (3) and one in a closer's error as that closer's failure (1).
type runnerError struct{ err error }

func (e *runnerError) Error() string { return "shutdown: runner: " + e.err.Error() }
func (e *runnerError) Unwrap() error { return e.err }

// ExitCode maps Wait's result to a process exit status: 0 for a clean stop,
// 3 when the drain budget ran out, the final commit was not acknowledged or
// the runner ran out of time (records were left to the next owner, who gets
// them again; nothing is lost), 4 when a second signal forced the stop, 1
// otherwise — a closer's failure too, even one out of time (an
// http.Server.Shutdown returning ctx.Err()): the records' fate was settled
// before the closers ran.
func ExitCode(err error) int {
	var de *runner.DrainError
	var fce *runner.FinalCommitError
	var re *runnerError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrForced):
		return 4
	case errors.As(err, &de), errors.As(err, &fce):
		return 3
	case errors.As(err, &re) && errors.Is(re, context.DeadlineExceeded):
		return 3
	}
	return 1
}
