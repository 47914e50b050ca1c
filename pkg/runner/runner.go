package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// Runner consumes records from a Source and runs the registered handlers on
// them in parallel, committing only what is safe. Create one with New, start
// it with Run, stop it with Shutdown (graceful) or Close (immediate). A
// Runner runs once; a stopped Runner cannot be reused.
type Runner struct {
	cfg    config
	src    Source
	dlw    DeadLetterWriter
	log    *slog.Logger
	tel    *telemetry
	tracer tracer

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

	stats statsBox

	// Poll-goroutine state: nothing below is touched by another goroutine.
	table        *rebalance.Table
	parts        map[TP]*partState
	ready        queue
	inflight     int   // tasks queued for or running on workers
	totalBytes   int64 // what buffered and in-flight records are charged (memory.go)
	ringBytes    int64 // what owned partitions' tracker rings are charged (setRing)
	ringReal     int64 // what owned partitions' tracker rings take (claimed)
	heldBytes    int64 // what lanes held by fenced records are charged
	totalCount   int
	pauseAt      int64 // the charge at which every partition pauses (globalLimits)
	bandCount    [bands]int
	globalPaused bool
	flowDirty    []*partState
	pauseBuf     []TP
	resumeBuf    []TP
	overhead     int64        // RecordOverhead(cfg.ordering)
	free         []*task      // see freeTask
	freeLanes    []*lane      // see freeLane
	freeBytes    int64        // what the free lists and the idle lanes hold
	freeLow      int          // the least len(free) since the last trimFree
	freeLanesLow int          // the least len(freeLanes) since then
	keySeed      maphash.Seed // hashes KeyOrder's keys into lanes
	drains       []*drain
	drainTimer   *time.Timer
	committing   *commitReq
	stopping     bool
	finished     bool
	drainErr     error
	pendingBuf   []rebalance.Commit
	handlerCtx   context.Context
	afterCommit  []chan sinkReply // Lost (or replacing Assigned) replies held until the commit in flight is answered

	// KeyOrder's idle lanes, newest first (pushIdle), and the most records
	// buffered and in flight at once since the last tick, and over the
	// tick interval before (idleCap).
	idleNewest, idleOldest *lane
	idleN                  int
	countPeak, countPrev   int
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
		table:     rebalance.NewTable(),
		parts:     map[TP]*partState{},
		keySeed:   maphash.MakeSeed(),
	}
	r.workq.cond.L = &r.workq.mu
	r.pauseAt, _ = cfg.globalLimits()
	r.overhead = RecordOverhead(cfg.ordering)
	if cfg.policy.kind == policyDeadLetter {
		r.dlw = cfg.policy.writer
		if r.dlw == nil {
			w, ok := src.(DeadLetterWriter)
			if !ok {
				return nil, &ConfigError{Option: "Failure", Reason: "DeadLetter has no writer and the source does not implement DeadLetterWriter"}
			}
			r.dlw = w
		}
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
	r.tracer = newTracer(cfg.tracerProvider)
	return r, nil
}

// Run consumes until ctx is done, Shutdown or Close is called, or the source
// fails. When ctx ends, Run stops gracefully as Shutdown does, within the
// DrainBudget. It returns nil after a clean stop, a *DrainError when handlers
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
	r.handlerCtx = hard

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

	// Cancel whatever still runs (handlers past the budget, or everything on
	// Close), then wait for our goroutines before leaving the group.
	for _, ps := range r.parts {
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
		err = srcErr
	}
	r.tel.unregister()
	r.runErr = err
	return err
}

// Shutdown stops the runner gracefully: it stops fetching, drops buffered
// records that have not started, waits for in-flight handlers, commits the
// safe offsets synchronously, cancels what is still running, and closes the
// source (leaving the group). The drain gets 70% of the time left until
// ctx's deadline; the final commit gets what is left of it (at most
// CommitTimeout), then the source is closed. Without a deadline it waits
// until the handlers finish or ctx is done. Shutdown returns when Run has
// returned: nil after a clean stop, the *DrainError or *FinalCommitError
// Run returned, or ctx.Err() if ctx ended first (then it calls Close, and
// Run returns a *FinalCommitError unless the final commit had been
// acknowledged). Called after Run returned, it returns what Run returned.
//
// Shutdown before Run stops the runner, as net/http's Shutdown stops a
// Server before Serve: it returns nil, and a later Run returns ErrStopped
// at once without starting the source (so a signal that arrives during
// start-up is not lost).
func (r *Runner) Shutdown(ctx context.Context) error {
	if r.state.CompareAndSwap(lifeNew, lifeStopped) || r.state.Load() == lifeStopped {
		return nil
	}
	var drainDeadline, deadline time.Time
	if d, ok := ctx.Deadline(); ok {
		now := time.Now()
		drainDeadline, deadline = now.Add(d.Sub(now)*7/10), d
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
	// unfinished record.
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

// drain is a revoke or a shutdown waiting for in-flight handlers. It holds
// the assignments it drains, not their names: the source may report a
// partition assigned again while its old assignment drains, and the drain
// must then neither wait for nor end the new one.
type drain struct {
	parts    []*partState
	deadline time.Time // zero: none
	// commitBy bounds the final commit (Shutdown's deadline); zero: only
	// CommitTimeout does.
	commitBy time.Time
	ctxDone  <-chan struct{}
	reply    chan error // nil for a shutdown
	stop     bool
	ready    bool // drained or out of time: waiting for its final commit
}

type commitReq struct {
	commits  []rebalance.Commit
	offsets  []Offset
	deadline time.Time
	drains   []*drain // finished by this commit
	err      error
	took     time.Duration
}

func (r *Runner) loop(ctx context.Context, srcDone <-chan struct{}, srcErr *error) error {
	ticker := time.NewTicker(r.cfg.commitInterval)
	defer ticker.Stop()
	r.drainTimer = time.NewTimer(time.Hour)
	r.drainTimer.Stop()
	ctxDone := ctx.Done()
	var stopCtxDone <-chan struct{}
	for !r.finished {
		select {
		case req := <-r.sinkCh:
			r.onSink(req)
		case <-r.doneq.signal:
			r.onFinished()
		case c := <-r.commitRes:
			r.onCommitted(c)
		case <-ticker.C:
			r.tick()
		case <-r.drainTimer.C:
			r.checkDrains()
		case s := <-r.stopCh:
			stopCtxDone = s.ctxDone
			r.beginStop(s.drainDeadline, s.deadline, s.ctxDone)
		case <-ctxDone:
			ctxDone = nil
			r.beginStop(time.Now().Add(r.cfg.drainBudget), time.Time{}, nil)
		case <-stopCtxDone:
			stopCtxDone = nil
			r.checkDrains()
		case <-r.closeCh:
			if r.stopping {
				// A graceful stop was under way and its final commit was
				// not acknowledged (the loop would have returned).
				return &FinalCommitError{Err: errClosedInStop}
			}
			return nil
		case <-srcDone:
			// srcErr is written before srcDone is closed.
			err := *srcErr
			if err == nil && r.stopping {
				srcDone = nil
				continue
			}
			if err == nil {
				err = errors.New("runner: source stopped without an error before the runner did")
			}
			r.log.Error("source failed; stopping without a final commit", "err", err)
			return err
		}
		r.dispatch()
		r.flushFlow()
	}
	return r.drainErr
}

// onSink acts on one report from the source and answers it.
func (r *Runner) onSink(req *sinkReq) {
	if r.stopping && req.kind != sinkLost && req.kind != sinkRevoked {
		req.reply <- sinkReply{err: ErrStopped}
		return
	}
	switch req.kind {
	case sinkAssigned:
		replaced := false
		for i, a := range req.assigns {
			var f Applied
			if req.applied != nil {
				f = req.applied[i]
			}
			replaced = r.assign(a, f) || replaced
		}
		r.checkDrains() // an assignment can replace (lose) a partition a drain waits on
		r.flushFlow()   // under the global cap, new partitions start paused
		if replaced && r.committing != nil {
			// The replaced assignments were lost: answer as for Lost, once
			// a commit built for them can no longer reach the source.
			r.afterCommit = append(r.afterCommit, req.reply)
			return
		}
		req.reply <- sinkReply{}
	case sinkFetched:
		for i := range req.batches {
			r.deliver(&req.batches[i])
		}
		r.fitFree()
		// Pause before answering: the source's next poll must already
		// leave out the partitions at their high water mark. Answer before
		// dispatching (the loop dispatches right after), so the source's
		// next poll overlaps the dispatch.
		r.flushFlow()
		req.reply <- sinkReply{budget: r.budget()}
	case sinkLost:
		for _, tp := range req.tps {
			r.lose(tp)
		}
		r.checkDrains()
		if r.committing != nil {
			// A commit built before the loss may still be on its way to
			// the source. Answer only after it was answered, so the
			// source cannot rejoin, get the partition back and then send
			// that old offset under the new generation.
			r.afterCommit = append(r.afterCommit, req.reply)
			return
		}
		req.reply <- sinkReply{}
	case sinkRevoked:
		deadline := time.Now().Add(r.cfg.drainBudget)
		if !req.deadline.IsZero() && req.deadline.Before(deadline) {
			deadline = req.deadline
		}
		d := &drain{deadline: deadline, reply: req.replyErr}
		for _, tp := range req.tps {
			// A partition already draining (a shutdown) joins this drain
			// too, so the source waits for its final commit.
			if ps := r.parts[tp]; ps != nil {
				d.parts = append(d.parts, ps)
				if !ps.revoking {
					r.stopDispatch(ps)
				}
			}
		}
		if len(d.parts) == 0 {
			req.replyErr <- nil
			return
		}
		r.tel.revokes.Add(context.Background(), 1)
		r.drains = append(r.drains, d)
		r.checkDrains()
	}
}

// assign sets up a new assignment of a.TP; it reports whether it replaced
// one the runner still held (which it drops as lost).
func (r *Runner) assign(a Assignment, applied Applied) (replaced bool) {
	if old := r.parts[a.TP]; old != nil {
		// A source reporting an assignment it already gave us has lost
		// track; treat the old assignment as lost (never commit for it).
		r.log.Warn("partition assigned again without a revoke; dropping the old assignment", "partition", a.TP.String())
		r.lose(a.TP)
		replaced = true
	}
	p := r.table.Assign(a.TP, a.Start)
	ctx, cancel := context.WithCancel(r.handlerCtx)
	ps := &partState{p: p, epoch: p.Epoch(), tp: a.TP, ctx: ctx, cancel: cancel, pendingPos: -1, hwm: -1, applied: applied,
		band: -1, fencedOff: -1}
	switch r.cfg.ordering {
	case KeyOrder:
		ps.lanes = map[uint64]*lane{}
	case PartitionOrder:
		ps.lane = &lane{}
	}
	r.parts[a.TP] = ps
	if r.globalPaused {
		r.flowDirty = append(r.flowDirty, ps)
	}
	r.log.Debug("partition assigned", "partition", a.TP.String(), "epoch", uint64(ps.epoch), "start", a.Start,
		"generation", a.Generation, "member", a.Member)
	return replaced
}

func (r *Runner) deliver(b *Batch) {
	ps := r.parts[b.TP]
	if ps == nil || ps.revoking {
		// Sources must not deliver for partitions they did not assign or
		// are revoking; dropping is safe because nothing was recorded.
		r.log.Warn("records for a partition not owned; dropped", "partition", b.TP.String(), "records", len(b.Records))
		return
	}
	h := r.cfg.handlers[b.TP.Topic]
	now := time.Now()
	for i := range b.Records {
		rec := &b.Records[i]
		if err := ps.p.Deliver(rec.Offset); err != nil {
			// A redelivered or out-of-order offset: the first delivery is
			// tracked, so this copy is dropped, loudly.
			r.log.Warn("record delivered out of order; dropped", "record", rec.String(), "err", err)
			r.tel.outOfOrder.Add(context.Background(), 1)
			continue
		}
		t := r.newTask()
		t.size = copyRecord(&t.rec, rec) + r.overhead
		t.handler = h
		t.ps = ps
		t.epoch = ps.epoch
		t.delivered = now
		ps.link(t)
		ps.count++
		ps.bytes += t.size
		r.totalCount++
		r.totalBytes += t.size
		r.countPeak = max(r.countPeak, r.totalCount)
		if h == nil {
			// No handler for this topic: fail loudly through the policy
			// rather than skip silently.
			t.handler = noHandler
		}
		r.enqueue(ps, t)
	}
	r.setRing(ps)
	if b.HighWatermark > ps.hwm {
		ps.hwm = b.HighWatermark
	}
	if b.Position > ps.pendingPos {
		ps.pendingPos = b.Position
		r.applyPosition(ps)
	}
	r.checkFlow(ps)
}

func noHandler(_ context.Context, rec Record) error {
	return fmt.Errorf("runner: no handler registered for topic %q (record %s)", rec.Topic, rec.String())
}

// enqueue puts t in its lane, or straight into the ready queue when its lane
// is idle or it has none.
func (r *Runner) enqueue(ps *partState, t *task) {
	var l *lane
	switch r.cfg.ordering {
	case KeyOrder:
		if t.rec.Key != nil {
			h := maphash.Bytes(r.keySeed, t.rec.Key)
			l = ps.lanes[h]
			switch {
			case l == nil:
				l = r.newLane(ps, h)
				ps.lanes[h] = l
				ps.lanePeak = max(ps.lanePeak, len(ps.lanes))
			case !l.busy:
				r.unlinkIdle(l) // the key came back while its lane was cached
			}
		}
	case PartitionOrder:
		l = ps.lane
	}
	t.lane = l
	if l == nil {
		r.ready.push(t)
		return
	}
	if l.busy {
		l.waiting.push(t)
		return
	}
	l.busy = true
	r.ready.push(t)
}

// dispatch moves ready tasks to the workers' queue while fewer than
// Concurrency tasks are queued or running.
func (r *Runner) dispatch() {
	var head, tail *task
	n := 0
	for r.inflight < r.cfg.concurrency {
		t := r.ready.pop()
		if t == nil {
			break
		}
		if t.dropped {
			r.freeTask(t)
			continue
		}
		t.started = true
		t.ps.inflight++
		r.inflight++
		if head == nil {
			head = t
		} else {
			tail.nextQ = t
		}
		tail = t
		n++
	}
	if n > 0 {
		r.workq.push(head, tail, n)
	}
}

// onFinished takes back every task the workers finished since last time.
func (r *Runner) onFinished() {
	for t := r.doneq.take(); t != nil; {
		next := t.nextQ
		r.onDone(t)
		t = next
	}
}

// onDone takes a finished task back from a worker.
func (r *Runner) onDone(t *task) {
	ps := t.ps
	r.inflight--
	ps.inflight--
	ps.count--
	ps.bytes -= t.size
	r.totalCount--
	r.totalBytes -= t.size
	ps.unlink(t)

	if t.res != resCancelled && t.res != resFenced {
		switch ps.p.Complete(t.epoch, t.rec.Offset) {
		case rebalance.Advanced:
			r.applyPosition(ps)
		case rebalance.OldAssignment, rebalance.NotOwner:
			r.tel.stale.Add(context.Background(), 1)
		}
	}
	if t.res == resFenced && !ps.closed && (ps.fencedOff < 0 || t.rec.Offset < ps.fencedOff) {
		// The safe offset never passes it in this assignment: remember
		// it for the oldest-unfinished stats.
		ps.fencedOff, ps.fencedAt, ps.fencedErr = t.rec.Offset, t.delivered, t.failure()
	}
	if l := t.lane; l != nil && !ps.closed {
		if t.res == resFenced {
			// The record belongs to the partition's next owner, who
			// replays it and what follows it. The lane stays busy, so
			// the rest of its key (or partition) waits too: should the
			// fence have been transient, a later record of the key must
			// not apply before this one (invariant 5). A revoke or loss
			// drops what waits. The lane stays charged meanwhile.
			if !l.held {
				l.held = true
				ps.held++
				r.heldBytes += laneCharge
			}
		} else if next := l.waiting.pop(); next != nil {
			r.ready.push(next)
		} else {
			l.busy = false
			if r.cfg.ordering == KeyOrder {
				// An idle key lane stays in the map, a cache for a key
				// that comes back, as long as the idle lanes fit.
				r.pushIdle(l)
				r.fitIdle()
			}
		}
	}
	r.freeTask(t)
	if !ps.closed {
		r.checkFlow(ps)
	} else {
		r.checkGlobal()
	}
	if ps.revoking && ps.inflight == 0 {
		r.checkDrains()
	}
}

// applyPosition moves the safe offset to the fetch position once nothing
// delivered is outstanding, so lag reaches zero past control records.
func (r *Runner) applyPosition(ps *partState) {
	if ps.pendingPos < 0 || ps.p.Tracker().Outstanding() > 0 {
		return
	}
	ps.p.Position(ps.epoch, ps.pendingPos)
	ps.pendingPos = -1
}

// stopDispatch starts a partition's drain: records that have not started are
// dropped (they will be replayed by the next owner), in-flight ones go on.
func (r *Runner) stopDispatch(ps *partState) {
	ps.revoking = true
	ps.draining.Store(true)
	for _, l := range ps.lanes {
		r.dropWaiting(ps, l)
	}
	if ps.lane != nil {
		r.dropWaiting(ps, ps.lane)
	}
	for t := ps.oldest; t != nil; {
		next := t.next
		if !t.started && !t.dropped {
			// In the ready queue: mark it; dispatch frees it. Its lane
			// has nothing else (what waited in it was dropped above): it
			// is idle, like the lane of a record that finished.
			r.drop(ps, t)
			if l := t.lane; l != nil && !l.held {
				l.busy = false
				if r.cfg.ordering == KeyOrder {
					r.pushIdle(l)
				}
			}
		}
		t = next
	}
	r.fitIdle()
	if ps.paused {
		ps.paused = false
		r.flowDirty = append(r.flowDirty, ps)
	}
	r.setBand(ps)
	r.checkGlobal()
}

func (r *Runner) dropWaiting(ps *partState, l *lane) {
	for t := l.waiting.pop(); t != nil; t = l.waiting.pop() {
		r.drop(ps, t)
		r.freeTask(t)
	}
}

func (r *Runner) drop(ps *partState, t *task) {
	t.dropped = true
	ps.unlink(t)
	ps.count--
	ps.bytes -= t.size
	r.totalCount--
	r.totalBytes -= t.size
}

func (r *Runner) lose(tp TP) {
	ps := r.parts[tp]
	if ps == nil {
		return
	}
	r.stopDispatch(ps)
	r.table.Lose(tp)
	ps.closed = true
	ps.cancel()
	r.release(ps)
	delete(r.parts, tp)
	r.tel.lost.Add(context.Background(), 1)
	r.log.Warn("partition lost; nothing will be committed for it", "partition", tp.String(), "epoch", uint64(ps.epoch), "in_flight", ps.inflight)
	// Its bytes left the total: the global cap may lift. Drains waiting on
	// it are checked by the caller, once every partition of the report is
	// gone: checking here could send a final commit for a partition lost in
	// the same report.
	r.checkGlobal()
}

// beginStop starts a graceful stop: a drain of every partition until
// deadline (zero: none) or until ctxDone, then a final commit bounded by
// commitBy (zero: CommitTimeout alone).
func (r *Runner) beginStop(deadline, commitBy time.Time, ctxDone <-chan struct{}) {
	if r.stopping {
		return
	}
	r.stopping = true
	r.log.Info("stopping: draining in-flight handlers", "partitions", len(r.parts), "in_flight", r.inflight, "deadline", deadline)
	d := &drain{deadline: deadline, commitBy: commitBy, ctxDone: ctxDone, stop: true}
	for _, ps := range r.parts {
		// A partition already draining for a revoke joins the stop drain
		// too: the stop must not end before that revoke's handlers did.
		d.parts = append(d.parts, ps)
		if !ps.revoking {
			r.stopDispatch(ps)
		}
	}
	r.drains = append(r.drains, d)
	r.checkDrains()
}

// checkDrains marks drains whose partitions are idle (or whose time is up)
// ready, and starts the final commit when the committer is free.
func (r *Runner) checkDrains() {
	now := time.Now()
	var next time.Time
	for _, d := range r.drains {
		if d.ready {
			continue
		}
		expired := !d.deadline.IsZero() && !now.Before(d.deadline)
		if d.ctxDone != nil {
			select {
			case <-d.ctxDone:
				expired = true
			default:
			}
		}
		idle := true
		for _, ps := range d.parts {
			if !ps.closed && ps.inflight > 0 {
				idle = false
				break
			}
		}
		if idle || expired {
			d.ready = true
			continue
		}
		if !d.deadline.IsZero() && (next.IsZero() || d.deadline.Before(next)) {
			next = d.deadline
		}
	}
	if !next.IsZero() {
		r.drainTimer.Reset(time.Until(next))
	}
	r.finalCommit()
}

// finalCommit sends one synchronous commit for every ready drain once no
// other commit is in flight (commits are sequenced, one at a time).
func (r *Runner) finalCommit() {
	if r.committing != nil {
		return
	}
	var ready []*drain
	rest := r.drains[:0]
	for _, d := range r.drains {
		if d.ready {
			ready = append(ready, d)
		} else {
			rest = append(rest, d)
		}
	}
	if len(ready) == 0 {
		return
	}
	r.drains = rest
	// The drain's time may be up: the final commit gets its own
	// CommitTimeout, within what is left of Shutdown's budget.
	var by time.Time
	for _, d := range ready {
		if !d.commitBy.IsZero() && (by.IsZero() || d.commitBy.Before(by)) {
			by = d.commitBy
		}
	}
	c := r.newCommit(by)
	c.drains = ready
	if len(c.offsets) == 0 {
		r.finishDrains(ready, nil)
		return
	}
	r.send(c)
}

func (r *Runner) newCommit(deadline time.Time) *commitReq {
	r.pendingBuf = r.table.Pending(r.pendingBuf[:0])
	c := &commitReq{deadline: deadline}
	if len(r.pendingBuf) > 0 {
		c.commits = append([]rebalance.Commit(nil), r.pendingBuf...)
		c.offsets = make([]Offset, len(c.commits))
		for i, pc := range c.commits {
			c.offsets[i] = Offset{TP: pc.TP, Offset: pc.Offset}
		}
	}
	return c
}

func (r *Runner) send(c *commitReq) {
	r.committing = c
	r.commitReq <- c // capacity 1 and at most one in flight: never blocks
}

// tick runs every commit interval: an asynchronous commit of the safe
// offsets and a refresh of the stats the probes and gauges read.
func (r *Runner) tick() {
	r.publishStats()
	r.trimMemory()
	if r.committing != nil || r.stopping {
		return
	}
	c := r.newCommit(time.Time{})
	if len(c.offsets) > 0 {
		r.send(c)
	}
}

func (r *Runner) onCommitted(c *commitReq) {
	r.committing = nil
	for _, reply := range r.afterCommit {
		reply <- sinkReply{}
	}
	r.afterCommit = r.afterCommit[:0]
	r.tel.commitLatency.Record(context.Background(), c.took.Seconds())
	if c.err != nil {
		r.tel.commitFailures.Add(context.Background(), 1)
		if len(c.drains) > 0 {
			r.log.Error("final commit failed; the records after the last acknowledged offsets will be delivered again", "err", c.err, "partitions", len(c.commits))
		} else {
			r.log.Warn("commit failed; the next commit sends the newest safe offsets", "err", c.err, "partitions", len(c.commits))
		}
		for _, pc := range c.commits {
			r.table.CommitFailed(pc)
		}
	} else {
		for _, pc := range c.commits {
			r.table.Committed(pc)
		}
	}
	if len(c.drains) > 0 {
		var err error
		if c.err != nil {
			err = &FinalCommitError{Err: c.err}
		}
		r.finishDrains(c.drains, err)
	}
	r.finalCommit()
}

// finishDrains ends drains after their final commit, ending the epochs of
// their partitions and answering the source; commitErr is that commit's
// failure, reported with each drain's result.
func (r *Runner) finishDrains(ds []*drain, commitErr error) {
	for _, d := range ds {
		unfinished := map[TP]int64{}
		for _, ps := range d.parts {
			if ps.closed {
				continue // lost, or assigned anew, while draining
			}
			tp := ps.tp
			if ps.inflight > 0 {
				unfinished[tp] = ps.p.Safe()
			}
			final, _ := r.table.Revoke(tp)
			ps.closed = true
			ps.cancel()
			r.release(ps)
			delete(r.parts, tp)
			r.log.Info("partition revoked", "partition", tp.String(), "epoch", uint64(ps.epoch), "safe", final, "acknowledged", ps.p.Acknowledged(), "unfinished", ps.inflight)
		}
		var err error
		if len(unfinished) > 0 {
			err = &DrainError{Unfinished: unfinished}
			r.log.Warn("drain budget ran out", "err", err)
		}
		if commitErr != nil {
			err = errors.Join(err, commitErr)
		}
		if d.stop {
			r.drainErr = err
			r.finished = true
		} else {
			d.reply <- err
		}
	}
}

// committer is the one goroutine that calls Source.Commit, one request at a
// time, so commits are sequenced and the poll loop never blocks on the
// broker.
func (r *Runner) committer(ctx context.Context) {
	for c := range r.commitReq {
		// CommitTimeout bounds every request; a final commit of a
		// shutdown also ends with Shutdown's ctx (c.deadline).
		by := time.Now().Add(r.cfg.commitTimeout)
		if !c.deadline.IsZero() && c.deadline.Before(by) {
			by = c.deadline
		}
		cctx, cancel := context.WithDeadline(ctx, by)
		start := time.Now()
		c.err = r.src.Commit(cctx, c.offsets)
		c.took = time.Since(start)
		cancel()
		select {
		case r.commitRes <- c:
		case <-r.loopDone:
		}
	}
}

// sink kinds and the request that carries a Sink call to the loop.
type sinkKind uint8

const (
	sinkAssigned sinkKind = iota
	sinkRevoked
	sinkLost
	sinkFetched
)

type sinkReq struct {
	kind     sinkKind
	assigns  []Assignment
	applied  []Applied // parallel to assigns, or nil
	tps      []TP
	deadline time.Time
	batches  []Batch
	reply    chan sinkReply
	replyErr chan error
}

type sinkReply struct {
	budget int
	err    error
}

// sinkOf is the Sink the runner gives its source.
type sinkOf struct{ r *Runner }

func (s sinkOf) call(ctx context.Context, req *sinkReq) (sinkReply, error) {
	req.reply = make(chan sinkReply, 1)
	select {
	case s.r.sinkCh <- req:
	case <-s.r.loopDone:
		return sinkReply{}, ErrStopped
	case <-ctx.Done():
		return sinkReply{}, ctx.Err()
	}
	// Once the loop took the request it always answers, unless it stops.
	select {
	case rep := <-req.reply:
		return rep, rep.err
	case <-s.r.loopDone:
		return sinkReply{}, ErrStopped
	}
}

func (s sinkOf) Assigned(ctx context.Context, parts []Assignment) error {
	var applied []Applied
	if h := s.r.cfg.assignHook; h != nil && len(parts) > 0 {
		var err error
		if applied, err = s.r.runHook(ctx, h, parts); err != nil {
			return err
		}
	}
	_, err := s.call(ctx, &sinkReq{kind: sinkAssigned, assigns: parts, applied: applied})
	return err
}

// runHook calls the assign hook for one report until it succeeds, retrying
// with backoff; it gives up only when ctx is done or the runner stopped.
func (r *Runner) runHook(ctx context.Context, h AssignHook, as []Assignment) ([]Applied, error) {
	for attempt := 1; ; attempt++ {
		f, err := h(ctx, as)
		if err == nil && f != nil && len(f) != len(as) {
			err = fmt.Errorf("runner: the assign hook returned %d filters for %d assignments", len(f), len(as))
		}
		if err == nil {
			return f, nil
		}
		r.log.Error("assign hook failed; retrying, the partitions' records wait", "partitions", len(as),
			"first", as[0].TP.String(), "generation", as[0].Generation, "member", as[0].Member, "attempt", attempt, "err", err)
		tm := time.NewTimer(backoff(r.cfg.backoffInitial, r.cfg.backoffMax, attempt))
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil, ctx.Err()
		case <-r.loopDone:
			tm.Stop()
			return nil, ErrStopped
		}
	}
}

func (s sinkOf) Lost(ctx context.Context, tps []TP) error {
	_, err := s.call(ctx, &sinkReq{kind: sinkLost, tps: tps})
	return err
}

func (s sinkOf) Fetched(ctx context.Context, batches []Batch) (int, error) {
	rep, err := s.call(ctx, &sinkReq{kind: sinkFetched, batches: batches})
	return rep.budget, err
}

func (s sinkOf) Revoked(ctx context.Context, tps []TP, deadline time.Time) error {
	req := &sinkReq{kind: sinkRevoked, tps: tps, deadline: deadline, replyErr: make(chan error, 1)}
	select {
	case s.r.sinkCh <- req:
	case <-s.r.loopDone:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	// The revoke's own deadline bounds the wait; ctx is not consulted so a
	// client callback context cannot cut the final commit short.
	select {
	case err := <-req.replyErr:
		return err
	case <-s.r.loopDone:
		return ErrStopped
	}
}
