package runner

import (
	"context"
	"hash/maphash"
	"log/slog"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// pollState is the state of the runner's poll goroutine: the partitions and
// their lanes, flow control, memory accounting, drains and commits. It
// starts no goroutine, never calls the Source and never sends or receives
// on a channel (it keeps the reply channels of Sink calls it holds, to name
// them in its actions): each event below (a Sink report, finished tasks, a
// commit's answer, a tick, a drain deadline, a stop) changes the state and
// returns the actions it calls for — answers to the source, a commit,
// tasks for the workers, partitions to pause or resume, the next drain
// deadline — which Runner.loop carries out (carryOut). So it can be
// driven, and its actions checked, with no goroutine, Source or sleep
// (state_test.go).
//
// What it does keep inside is not I/O to the broker or the database:
// logging, metrics, cancelling a lost or drained partition's handler
// context, setting the flag workers read to skip a draining partition's
// tasks, and reading its clock (now). It is not safe for concurrent use:
// only the poll goroutine calls it (and tests, before Run).
type pollState struct {
	cfg        *config // the Runner's
	log        *slog.Logger
	tel        *telemetry
	handlerCtx context.Context // the parent of the partitions' contexts (Run's)
	settled    bool            // the source is a Settler: no tracker, no commits (settle.go)

	table        *rebalance.Table
	parts        map[TP]*partState
	ready        queue
	inflight     int   // records queued for or running on workers
	batchExtra   int   // of them, batch records beyond each batch's first: inflight-batchExtra handler calls
	totalBytes   int64 // what buffered and in-flight records are charged (memory.go)
	ringBytes    int64 // what owned partitions' tracker rings are charged (setRing)
	ringReal     int64 // what owned partitions' tracker rings take (claimed)
	heldBytes    int64 // what lanes held by fenced records are charged
	totalCount   int
	pauseAt      int64 // the charge at which every partition pauses (globalLimits)
	bandCount    [bands]int
	globalPaused bool
	flowDirty    []*partState
	ops          opState      // the operator's pauses (operator.go)
	overhead     int64        // RecordOverhead(cfg.ordering)
	free         []*task      // see freeTask
	freeLanes    []*lane      // see freeLane
	freeBytes    int64        // what the free lists and the idle lanes hold
	freeLow      int          // the least len(free) since the last trimFree
	freeLanesLow int          // the least len(freeLanes) since then
	keySeed      maphash.Seed // hashes KeyOrder's keys into lanes
	drains       []*drain
	committing   *commitReq
	stopping     bool
	finished     bool
	drainErr     error
	pendingBuf   []rebalance.Commit
	afterCommit  []chan sinkReply // Lost (or replacing Assigned) replies held until the commit in flight is answered
	acts         actions          // what the events ask of the world, until carried out
	// now is the clock: time.Now, or a test's. It is read where the
	// logic needs the time, not once per event: an event per record
	// (Concurrency 1) would pay a clock read (about 50 ns) it rarely uses.
	now func() time.Time

	// KeyOrder's idle lanes, newest first (pushIdle), and the most records
	// buffered and in flight at once since the last tick, and over the
	// tick interval before (idleCap).
	idleNewest, idleOldest *lane
	idleN                  int
	countPeak, countPrev   int

	// Batch routes (batch_state.go): the partitions whose batch is due, in
	// the order they fell due; those whose ready records wait for their
	// batch to fill, and when the linger timer fires next (zero: it is
	// not set); whose turn dispatchMixed takes next.
	batchDue  []*partState
	lingering []*partState
	lingerAt  time.Time
	batchTurn bool
}

// newPollState returns the state of a Runner with configuration cfg, which
// it reads but never changes.
func newPollState(cfg *config, log *slog.Logger, tel *telemetry) pollState {
	pauseAt, _ := cfg.globalLimits()
	return pollState{
		cfg:        cfg,
		log:        log,
		tel:        tel,
		handlerCtx: context.Background(), // Run sets its own
		table:      rebalance.NewTable(),
		parts:      map[TP]*partState{},
		pauseAt:    pauseAt,
		overhead:   RecordOverhead(cfg.ordering),
		keySeed:    maphash.MakeSeed(),
		now:        time.Now,
	}
}

// The events. Each returns the actions it calls for, which the loop
// carries out before the next event (and those of settle after each). They
// are the state's own (acts), valid until carried out: carryOut resets
// them, and an event's actions add to those not yet carried out. They are
// returned in place, not copied: copying the struct in and out made an
// event that calls for nothing cost the loop about 170 ns instead of 20,
// and with Concurrency(1) there is an event per record.

// reported acts on a Sink call of the source (req) and answers it, now or
// once the commit in flight was answered (committed).
func (s *pollState) reported(req *sinkReq) *actions {
	s.onSink(req)
	return &s.acts
}

// tasksFinished takes back the tasks the workers finished, linked from t
// through nextQ.
func (s *pollState) tasksFinished(t *task) *actions {
	s.onFinished(t)
	return &s.acts
}

// committed takes the committer's answer to the commit in flight.
func (s *pollState) committed(c *commitReq) *actions {
	s.onCommitted(c)
	return &s.acts
}

// ticked runs the commit interval's tick (the loop publishes the stats
// first).
func (s *pollState) ticked() *actions {
	s.tick()
	return &s.acts
}

// drainDue checks the drains once the time of actions.drainAt came.
func (s *pollState) drainDue() *actions {
	s.checkDrains()
	return &s.acts
}

// lingerFired checks the batches waiting to fill once the time of
// actions.lingerAt came.
func (s *pollState) lingerFired() *actions {
	s.lingerDue()
	return &s.acts
}

// stop begins a graceful stop (beginStop); a second stop tightens it.
func (s *pollState) stop(deadline, commitBy time.Time, untilCtx bool) *actions {
	s.beginStop(deadline, commitBy, untilCtx)
	return &s.acts
}

// shutdownCtxDone reports that Shutdown's ctx ended: a stop begun with
// untilCtx is out of time.
func (s *pollState) shutdownCtxDone() *actions {
	s.shutdownEnded()
	return &s.acts
}

// settle runs after every event: it hands ready tasks to the workers and
// tells the source what the event paused or resumed.
func (s *pollState) settle() *actions {
	s.dispatch()
	s.flushFlow()
	return &s.acts
}

// actions is what the poll state asks of the world after an event. The
// Runner carries them out (carryOut) in the order of the fields, then
// resets them.
type actions struct {
	// settlements are Settle calls for a Settler source (settle.go), made
	// first: a drain's answer must find its records settled.
	settlements []settlement
	// replies answer Sink calls waiting in the source, in order: reports
	// acted on, drains ended.
	replies []reply
	// commit is a commit request for the committer. Commits are sequenced,
	// one in flight at a time: an event sends at most one.
	commit *commitReq
	// work is the tasks to hand to the workers.
	work work
	// pause and resume are the partitions whose paused state changed, for
	// Source.Pause and Source.Resume.
	pause, resume []TP
	// answer answers the Sink call of the event after the pause and resume
	// calls: Fetched and Assigned pause partitions before they return.
	answer reply
	// drainAt is when a drain's time runs out next (zero: no change).
	drainAt time.Time
	// lingerAt is when a partition's batch falls due next (zero: no
	// change).
	lingerAt time.Time
}

// reply is the answer to one Sink call: rep on to, or rep.err on toErr
// (Revoked).
type reply struct {
	to    chan sinkReply
	toErr chan error
	rep   sinkReply
}

func (rp reply) send() {
	switch {
	case rp.to != nil:
		rp.to <- rp.rep // capacity 1, one answer per call: never blocks
	case rp.toErr != nil:
		rp.toErr <- rp.rep.err
	}
}

// reset empties a once it was carried out, keeping its slices' arrays.
// It writes only the fields that are set: most events set one or two, and
// the loop resets twice per event.
func (a *actions) reset() {
	if len(a.settlements) > 0 {
		a.settlements = a.settlements[:0]
	}
	if len(a.replies) > 0 {
		clear(a.replies)
		a.replies = a.replies[:0]
	}
	if a.commit != nil {
		a.commit = nil
	}
	if a.work.n > 0 {
		a.work = work{}
	}
	if len(a.pause) > 0 {
		a.pause = a.pause[:0]
	}
	if len(a.resume) > 0 {
		a.resume = a.resume[:0]
	}
	if a.answer.to != nil || a.answer.toErr != nil {
		a.answer = reply{}
	}
	if !a.drainAt.IsZero() {
		a.drainAt = time.Time{}
	}
	if !a.lingerAt.IsZero() {
		a.lingerAt = time.Time{}
	}
}

// work is n tasks linked head..tail through nextQ.
type work struct {
	head, tail *task
	n          int
}

// add appends the n tasks linked head..tail.
func (w *work) add(head, tail *task, n int) {
	if w.n == 0 {
		w.head = head
	} else {
		w.tail.nextQ = head
	}
	w.tail = tail
	w.n += n
}
