package shutdown

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
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

// DefaultBudget is the shutdown budget when none is configured.
const DefaultBudget = 20 * time.Second

// BudgetFromEnv reads TIDEMARK_SHUTDOWN_BUDGET (a Go duration such as "25s").
// It returns DefaultBudget when the variable is unset, and an error naming
// the variable and the value when it is not a positive duration.
func BudgetFromEnv() (time.Duration, error) {
	v, ok := os.LookupEnv("TIDEMARK_SHUTDOWN_BUDGET")
	if !ok || v == "" {
		return DefaultBudget, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("shutdown: TIDEMARK_SHUTDOWN_BUDGET=%q is not a positive duration (e.g. 25s)", v)
	}
	return d, nil
}

// Probes serves liveness, readiness and status for one runner. It is safe for
// concurrent use. The zero value is not usable; use NewProbes.
type Probes struct {
	r        Runner
	maxStall time.Duration
	started  atomic.Bool
	draining atomic.Bool
	now      func() time.Time
}

// NewProbes returns probes for r. maxStall is how old the runner's last
// poll-loop tick may be before liveness fails; it must be several of the
// runner's commit intervals (the tick's period). Zero means 30s.
func NewProbes(r Runner, maxStall time.Duration) *Probes {
	if maxStall <= 0 {
		maxStall = 30 * time.Second
	}
	return &Probes{r: r, maxStall: maxStall, now: time.Now}
}

// Started marks the runner as running; call it right before Run.
func (p *Probes) Started() { p.started.Store(true) }

// Draining turns readiness off for good; the coordinator calls it first
// thing on a signal.
func (p *Probes) Draining() { p.draining.Store(true) }

// Live reports whether the poll loop is making progress, and why not.
func (p *Probes) Live() (bool, string) {
	if !p.started.Load() {
		return true, "starting"
	}
	s := p.r.Stats()
	if s.LoopAt.IsZero() {
		// No tick yet: the loop has run for less than a commit interval.
		return true, "starting"
	}
	if age := p.now().Sub(s.LoopAt); age > p.maxStall {
		return false, fmt.Sprintf("poll loop has not ticked for %s (limit %s)", age.Round(time.Millisecond), p.maxStall)
	}
	return true, "ok"
}

// Ready reports whether the service should receive traffic: running and not
// draining.
func (p *Probes) Ready() (bool, string) {
	switch {
	case !p.started.Load():
		return false, "not started"
	case p.draining.Load() || p.r.Stats().Stopping:
		return false, "draining"
	}
	return true, "ok"
}

// Handler serves GET /livez, /readyz (200 or 503 with the reason) and
// /statusz (the runner's Stats as JSON).
func (p *Probes) Handler() http.Handler {
	mux := http.NewServeMux()
	probe := func(f func() (bool, string)) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			ok, why := f()
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintln(w, why)
		}
	}
	mux.HandleFunc("GET /livez", probe(p.Live))
	mux.HandleFunc("GET /readyz", probe(p.Ready))
	mux.HandleFunc("GET /statusz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(status(p.r.Stats()))
	})
	return mux
}

type partitionStatus struct {
	Partition     string  `json:"partition"`
	Epoch         uint64  `json:"epoch"`
	Safe          int64   `json:"safe"`
	Acknowledged  int64   `json:"acknowledged"`
	HighWatermark int64   `json:"high_watermark"`
	Buffered      int     `json:"buffered"`
	InFlight      int     `json:"in_flight"`
	Paused        bool    `json:"paused"`
	OldestSeconds float64 `json:"oldest_unfinished_seconds"`
}

type statusDoc struct {
	LoopAt     time.Time         `json:"loop_at"`
	Stopping   bool              `json:"stopping"`
	InFlight   int               `json:"in_flight"`
	Buffered   int               `json:"buffered"`
	Partitions []partitionStatus `json:"partitions"`
}

func status(s runner.Stats) statusDoc {
	d := statusDoc{LoopAt: s.LoopAt, Stopping: s.Stopping, InFlight: s.InFlight, Buffered: s.Buffered, Partitions: []partitionStatus{}}
	for _, p := range s.Partitions {
		d.Partitions = append(d.Partitions, partitionStatus{
			Partition: p.TP.String(), Epoch: p.Epoch, Safe: p.Safe, Acknowledged: p.Acknowledged,
			HighWatermark: p.HighWatermark, Buffered: p.Buffered, InFlight: p.InFlight, Paused: p.Paused,
			OldestSeconds: p.OldestAge.Seconds(),
		})
	}
	return d
}

// Closer is one thing to close after the runner stopped, in order.
type Closer struct {
	Name  string
	Close func(ctx context.Context) error
}

// Coordinator runs the graceful stop. Build it with NewCoordinator.
type Coordinator struct {
	r       Runner
	probes  *Probes
	budget  time.Duration
	closers []Closer
	log     *slog.Logger
}

// Option configures a Coordinator.
type Option func(*Coordinator)

// Budget sets the whole shutdown budget: 80% for the runner's drain and
// final commit (the runner keeps 30% of that for its commit and close), the
// rest for the closers. Default DefaultBudget.
func Budget(d time.Duration) Option { return func(c *Coordinator) { c.budget = d } }

// WithProbes makes the coordinator turn readiness off before the drain.
func WithProbes(p *Probes) Option { return func(c *Coordinator) { c.probes = p } }

// Close appends closers, run in order after the runner stopped.
func Close(cs ...Closer) Option { return func(c *Coordinator) { c.closers = append(c.closers, cs...) } }

// Logger sets the logger. Default slog.Default().
func Logger(l *slog.Logger) Option { return func(c *Coordinator) { c.log = l } }

// NewCoordinator returns a coordinator for r. A non-positive budget is an
// error naming it.
func NewCoordinator(r Runner, opts ...Option) (*Coordinator, error) {
	c := &Coordinator{r: r, budget: DefaultBudget, log: slog.Default()}
	for _, o := range opts {
		o(c)
	}
	if r == nil {
		return nil, errors.New("shutdown: nil runner")
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
