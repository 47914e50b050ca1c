package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Runner consumes records from a Source and runs the registered handlers on
// them in parallel, committing only what is safe. Create one with New, start
// it with Run, stop it with Shutdown (graceful) or Close (immediate). A
// Runner runs once; a stopped Runner cannot be reused.
type Runner struct {
	cfg config
	src Source
	log *slog.Logger
	tel *telemetry
	// group is the source's consumer group (Grouped), read once in New;
	// "" for a source without one.
	group string

	// settler is src when it settles records one by one (settle.go).
	settler Settler

	// Channels between the poll goroutine and everyone else.
	sinkCh    chan *sinkReq   // source → loop
	workq     workQueue       // loop → workers
	doneq     doneList        // workers → loop
	commitReq chan *commitReq // loop → committer
	commitRes chan *commitReq // committer → loop
	stopCh    chan stopReq    // Shutdown → loop
	closeCh   chan struct{}   // Close → loop
	closeOnce sync.Once
	loopDone  chan struct{} // closed when the loop has returned
	runDone   chan struct{} // closed when Run has returned
	state     atomic.Int32  // lifeNew, then lifeRunning (Run) or lifeStopped (Shutdown or Close first)
	runErr    error         // set before runDone is closed

	stats  statsBox
	opView opView    // what the operator paused, for OperatorPaused
	member memberLog // rebalance reports, for Stats.Member

	// drainTimer fires at the next drain deadline (actions.drainAt). It
	// is the poll goroutine's own, as what follows.
	drainTimer *time.Timer
	// lingerTimer fires when a batch falls due (actions.lingerAt).
	lingerTimer *time.Timer

	poll pollState // touched by the poll goroutine alone
}

// New returns a Runner over src. It validates the options and returns a
// *ConfigError naming the first invalid one; it never panics on user input.
func New(src Source, opts ...Option) (*Runner, error) {
	if src == nil {
		return nil, &ConfigError{Option: "Source", Reason: "nil source"}
	}
	cfg := defaults()
	cfg.logger = slog.Default()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.settledOptions(src); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		cfg:       cfg,
		src:       src,
		log:       cfg.logger.With("component", "tidemark.runner"),
		sinkCh:    make(chan *sinkReq),
		doneq:     doneList{signal: make(chan struct{}, 1)},
		commitReq: make(chan *commitReq, 1),
		commitRes: make(chan *commitReq, 1),
		stopCh:    make(chan stopReq, 1),
		closeCh:   make(chan struct{}),
		loopDone:  make(chan struct{}),
		runDone:   make(chan struct{}),
	}
	r.settler, _ = src.(Settler)
	if g, ok := src.(Grouped); ok {
		r.group = g.Group()
	}
	r.workq.cond.L = &r.workq.mu
	r.lingerTimer = time.NewTimer(time.Hour)
	r.lingerTimer.Stop()
	if err := cfg.deadLetterWriters(src); err != nil {
		return nil, err
	}
	if fl, ok := src.(FetchLimiter); ok {
		if err := fl.LimitFetch(cfg.fetchLimits()); err != nil {
			return nil, &ConfigError{Option: "MaxBufferedBytes", Reason: err.Error()}
		}
	}
	tel, err := newTelemetry(cfg.meterProvider, r)
	if err != nil {
		return nil, fmt.Errorf("runner: telemetry: %w", err)
	}
	r.tel = tel
	r.poll = newPollState(&r.cfg, r.log, tel)
	r.poll.settled = r.settler != nil
	return r, nil
}

// Run consumes until ctx is done, Shutdown or Close is called, or the source
// fails. When ctx ends, Run stops gracefully as Shutdown does, within the
// DrainBudget. If Shutdown or ShutdownWithin is called too (one SIGTERM
// can end a signal.NotifyContext ctx and reach a shutdown.Coordinator),
// the two make one stop, whichever came first: the drain ends at the
// earlier of DrainBudget after ctx ended and Shutdown's drain deadline,
// and the final commit is bounded by Shutdown's ctx. It returns nil after a clean stop, a *DrainError when handlers
// were still running at the end of the drain budget (everything before them
// was committed; they will be replayed), a *FinalCommitError (possibly
// joined with the *DrainError) when the final commit was not acknowledged
// — also when Close, or the end of Shutdown's ctx, cut a graceful stop
// short —, ErrStopped if the Runner already ran or was stopped before Run
// (then the source is not started), or the source's error.
// When Run returns, every goroutine it started has returned, provided
// handlers honour their ctx.
func (r *Runner) Run(ctx context.Context) error {
	if !r.state.CompareAndSwap(lifeNew, lifeRunning) {
		return ErrStopped
	}
	defer close(r.runDone)

	// hard is cancelled by Close or when Run returns; it bounds everything,
	// including the final commit after ctx is done.
	hard, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	r.poll.handlerCtx = hard

	var wg sync.WaitGroup
	for range r.cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker()
		}()
	}
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		r.committer(hard)
	}()
	srcCtx, srcCancel := context.WithCancel(hard)
	srcDone := make(chan struct{})
	var srcErr error
	go func() {
		defer close(srcDone)
		srcErr = r.src.Run(srcCtx, sinkOf{r})
	}()

	err := r.loop(ctx, srcDone, &srcErr)
	close(r.loopDone)
	// Whether the source had returned when the loop ended. If not, the
	// runner closes it below, and what its Run returns after that is the
	// answer to that Close, not a failure: a source whose Run started only
	// after the Close (a stop right at start-up, on a loaded machine)
	// returns its "closed" error.
	var srcEnded bool
	select {
	case <-srcDone:
		srcEnded = true
	default:
	}

	// Cancel whatever still runs (handlers past the budget, or everything on
	// Close), then wait for our goroutines before leaving the group.
	for _, ps := range r.poll.parts {
		ps.cancel()
	}
	hardCancel()
	r.workq.close()
	wg.Wait()
	close(r.commitReq)
	<-commitDone
	if cerr := r.src.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("runner: closing the source: %w", cerr)
	}
	srcCancel()
	<-srcDone
	if srcErr != nil && err == nil && !errors.Is(srcErr, context.Canceled) && !errors.Is(srcErr, ErrStopped) {
		if srcEnded {
			err = srcErr
		} else {
			r.log.Debug("the source returned an error after the runner closed it", "err", srcErr)
		}
	}
	r.tel.unregister()
	r.runErr = err
	return err
}

// Shutdown stops the runner gracefully: it stops fetching, drops buffered
// records that have not started, waits for in-flight handlers, commits the
// safe offsets synchronously, cancels what is still running, and closes the
// source (leaving the group). With a deadline D on ctx, the drain ends at
// D − min(CommitTimeout, half the time left to D) and the rest is reserved
// for the final commit and leaving the group: with the default 10s
// CommitTimeout, a 30s ctx drains for 20s, a 4s ctx for 2s. Use
// ShutdownWithin to set the drain's deadline yourself. Without a deadline
// it waits until the handlers finish or ctx is done.
//
// However the drain ends, the final commit gets CommitTimeout of its own,
// cut to what is left until ctx's deadline: a drain that used all its time
// does not take the commit's. Shutdown returns when Run has returned: nil
// after a clean stop, the *DrainError or *FinalCommitError Run returned, or
// ctx.Err() if ctx ended first (then it calls Close, and Run returns a
// *FinalCommitError unless the final commit had been acknowledged). Called
// after Run returned, it returns what Run returned.
//
// A stop already under way (Run's ctx ended, or an earlier Shutdown) is
// tightened, not ignored: the drain ends at the earlier of its deadline
// and this call's, and the final commit gets the earlier of their ctx
// deadlines, unless it was already sent (then it keeps CommitTimeout, and
// the end of ctx closes the runner as above). So a DrainBudget shorter
// than the drain Shutdown would give still ends the drain when Run's ctx
// has ended too.
//
// Shutdown before Run stops the runner, as net/http's Shutdown stops a
// Server before Serve: it returns nil, and a later Run returns ErrStopped
// at once without starting the source (so a signal that arrives during
// start-up is not lost).
func (r *Runner) Shutdown(ctx context.Context) error {
	var drainDeadline time.Time
	if d, ok := ctx.Deadline(); ok {
		// The final commit's reserve is one commit request's bound, but
		// never more than half of what is left: a short ctx still drains.
		left := time.Until(d)
		drainDeadline = d.Add(-min(r.cfg.commitTimeout, left/2))
	}
	return r.shutdown(ctx, drainDeadline)
}

// ShutdownWithin is Shutdown with the drain's deadline given: in-flight
// handlers get until drainDeadline (zero: until they finish or ctx ends),
// never past ctx's deadline; from then on what is left of ctx is the final
// commit's (each commit request also bounded by CommitTimeout) and leaving
// the group's. A drainDeadline already past ends the drain at once: the
// handlers still running are cancelled after the final commit. It returns
// what Shutdown returns. shutdown.Coordinator calls it with the split its
// Reserve option states.
func (r *Runner) ShutdownWithin(ctx context.Context, drainDeadline time.Time) error {
	return r.shutdown(ctx, drainDeadline)
}

func (r *Runner) shutdown(ctx context.Context, drainDeadline time.Time) error {
	if r.state.CompareAndSwap(lifeNew, lifeStopped) || r.state.Load() == lifeStopped {
		return nil
	}
	deadline, ok := ctx.Deadline()
	if ok && (drainDeadline.IsZero() || deadline.Before(drainDeadline)) {
		drainDeadline = deadline
	}
	select {
	case r.stopCh <- stopReq{drainDeadline: drainDeadline, deadline: deadline, ctxDone: ctx.Done()}:
	case <-r.loopDone:
	case <-ctx.Done():
		r.Close()
		return ctx.Err()
	}
	select {
	case <-r.runDone:
		return r.runErr
	case <-ctx.Done():
		r.Close()
		return ctx.Err()
	}
}

// Close stops the runner at once: no drain and no final commit (the last
// acknowledged commit stands; records after it are replayed by the next
// owner). Handlers' contexts are cancelled. Run returns nil, or a
// *FinalCommitError if a graceful stop (Shutdown, or the end of Run's ctx)
// had begun and its final commit was not yet acknowledged. Close before Run
// stops the runner: Run then returns ErrStopped at once, without starting
// the source. Close does not wait for Run to
// return; it is safe to call more than once and from any goroutine.
func (r *Runner) Close() error {
	r.state.CompareAndSwap(lifeNew, lifeStopped) // before Run: Run will not start
	r.closeOnce.Do(func() { close(r.closeCh) })
	return nil
}

// DrainError reports partitions whose handlers had not finished when a drain
// budget ran out. Their safe offsets were committed; the unfinished records
// will be delivered again to the next owner.
type DrainError struct {
	// Unfinished maps each partition to its committed safe offset, the first
	// unfinished record; over a Settler (no offsets committed), to the
	// lowest offset of its records still running.
	Unfinished map[TP]int64
}

func (e *DrainError) Error() string {
	parts := make([]string, 0, len(e.Unfinished))
	for tp, off := range e.Unfinished {
		parts = append(parts, fmt.Sprintf("%s@%d", tp, off))
	}
	sort.Strings(parts)
	return "runner: drain budget ran out with handlers unfinished at " + strings.Join(parts, ", ")
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) true.
func (e *DrainError) Unwrap() error { return context.DeadlineExceeded }

// FinalCommitError reports that the final commit of a revoke or a shutdown
// was not acknowledged. Nothing is lost: the group's committed offsets are
// the last acknowledged ones, and the records after them are delivered
// again to the next owner (the inbox makes that replay harmless).
type FinalCommitError struct {
	Err error // the Source's Commit error
}

func (e *FinalCommitError) Error() string {
	return "runner: final commit not acknowledged; records after the last acknowledged offsets will be delivered again: " + e.Err.Error()
}

// Unwrap returns Err.
func (e *FinalCommitError) Unwrap() error { return e.Err }

// The lifecycle states of a Runner.
const (
	lifeNew     int32 = iota // before Run, Shutdown or Close
	lifeRunning              // Run was called
	lifeStopped              // Shutdown or Close came before Run: Run will not start
)

type stopReq struct {
	drainDeadline time.Time // zero: none
	deadline      time.Time // Shutdown's own: bounds the final commit; zero: none
	ctxDone       <-chan struct{}
}

// errClosedInStop is the cause of the *FinalCommitError Run returns when
// Close (or the end of Shutdown's ctx) stops it before its final commit
// was acknowledged.
var errClosedInStop = errors.New("runner: closed before the final commit was acknowledged")
