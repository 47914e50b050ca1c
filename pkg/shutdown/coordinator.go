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

// BudgetEnv is the environment variable NewCoordinator reads the budget
// from when no Budget option is given.
const BudgetEnv = "TIDEMARK_SHUTDOWN_BUDGET"

// DefaultBudget is the shutdown budget when neither Budget nor
// TIDEMARK_SHUTDOWN_BUDGET sets one.
const DefaultBudget = 20 * time.Second

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
	r         Runner
	probes    *Probes
	budget    time.Duration
	budgetSet bool
	closers   []Closer
	log       *slog.Logger
}

// Option configures a Coordinator.
type Option func(*Coordinator)

// Budget sets the whole shutdown budget: 80% for the runner's drain and
// final commit (the runner keeps 30% of that for its commit and close), the
// rest for the closers. Budget wins over TIDEMARK_SHUTDOWN_BUDGET, which is
// read only when Budget is not given; without either, DefaultBudget.
func Budget(d time.Duration) Option {
	return func(c *Coordinator) { c.budget, c.budgetSet = d, true }
}

// WithProbes makes the coordinator turn readiness off before the drain.
func WithProbes(p *Probes) Option { return func(c *Coordinator) { c.probes = p } }

// Close appends closers, run in order after the runner stopped.
func Close(cs ...Closer) Option { return func(c *Coordinator) { c.closers = append(c.closers, cs...) } }

// Logger sets the logger. Default slog.Default().
func Logger(l *slog.Logger) Option { return func(c *Coordinator) { c.log = l } }

// NewCoordinator returns a coordinator for r. Without a Budget option it
// reads TIDEMARK_SHUTDOWN_BUDGET (BudgetFromEnv). A bad value of that
// variable and a non-positive budget are errors naming them.
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
	return c, nil
}

// ErrForced is returned (wrapped) when a second signal stopped the service
// at once.
var ErrForced = errors.New("shutdown: stopped at once by a second signal")

// Wait blocks until a signal arrives on sigs or ctx is done, then stops the
// service: readiness off, runner.Shutdown within the budget, closers in
// order. A second signal during the stop calls runner.Close and returns
// ErrForced at once. It returns nil when everything finished in time;
// otherwise the errors joined (a *runner.DrainError names the partitions
// left unfinished). Use ExitCode for the process's exit status.
func (c *Coordinator) Wait(ctx context.Context, sigs <-chan os.Signal) error {
	select {
	case sig := <-sigs:
		c.log.Info("signal received: stopping", "signal", sig.String(), "budget", c.budget)
	case <-ctx.Done():
		c.log.Info("context done: stopping", "budget", c.budget)
	}
	return c.Stop(sigs)
}

// Stop runs the graceful stop now; a signal on sigs (may be nil) forces it.
func (c *Coordinator) Stop(sigs <-chan os.Signal) error {
	start := time.Now()
	if c.probes != nil {
		c.probes.Draining()
	}
	deadline := start.Add(c.budget)
	drainCtx, cancel := context.WithDeadline(context.Background(), start.Add(c.budget*8/10))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.r.Shutdown(drainCtx) }()
	var errs []error
	select {
	case err := <-done:
		if err != nil {
			errs = append(errs, fmt.Errorf("shutdown: runner: %w", err))
		}
	case sig := <-sigs:
		c.log.Warn("second signal: stopping at once", "signal", sig.String())
		_ = c.r.Close()
		return ErrForced
	}
	c.log.Info("runner stopped", "took", time.Since(start).Round(time.Millisecond))
	closeCtx, cancelClose := context.WithDeadline(context.Background(), deadline)
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

// ExitCode maps Wait's result to a process exit status: 0 for a clean stop,
// 3 when the drain budget ran out or the final commit was not acknowledged
// (records were left to the next owner, who gets them again; nothing is
// lost), 4 when a second signal forced the stop, 1 otherwise.
func ExitCode(err error) int {
	var de *runner.DrainError
	var fce *runner.FinalCommitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrForced):
		return 4
	case errors.As(err, &de), errors.As(err, &fce), errors.Is(err, context.DeadlineExceeded):
		return 3
	}
	return 1
}
