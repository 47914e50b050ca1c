package runner

import (
	"context"
	"hash/maphash"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// pollState is the state of the runner's poll goroutine: the partitions and
// their lanes, flow control, memory accounting, drains and commits. Nothing
// in it is touched by another goroutine.
type pollState struct {
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
	handlerCtx   context.Context
	afterCommit  []chan sinkReply // Lost (or replacing Assigned) replies held until the commit in flight is answered
	acts         actions          // what the events so far ask of the world (take)
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
}

// The events. Each returns the actions it calls for; the loop carries them
// out, then those of settle.

// reported acts on a Sink call of the source (req) and answers it, now or
// once the commit in flight was answered (committed).
func (r *Runner) reported(req *sinkReq) actions {
	r.onSink(req)
	return r.take()
}

// tasksFinished takes back the tasks the workers finished, linked from t
// through nextQ.
func (r *Runner) tasksFinished(t *task) actions {
	r.onFinished(t)
	return r.take()
}

// committed takes the committer's answer to the commit in flight.
func (r *Runner) committed(c *commitReq) actions {
	r.onCommitted(c)
	return r.take()
}

// ticked runs the commit interval's tick (the loop publishes the stats
// first).
func (r *Runner) ticked() actions {
	r.tick()
	return r.take()
}

// drainDue checks the drains once the time of actions.drainAt came.
func (r *Runner) drainDue() actions {
	r.checkDrains()
	return r.take()
}

// stop begins a graceful stop (beginStop); a second stop changes nothing.
func (r *Runner) stop(deadline, commitBy time.Time, untilCtx bool) actions {
	r.beginStop(deadline, commitBy, untilCtx)
	return r.take()
}

// shutdownCtxDone reports that Shutdown's ctx ended: a stop begun with
// untilCtx is out of time.
func (r *Runner) shutdownCtxDone() actions {
	r.shutdownEnded()
	return r.take()
}

// settle runs after every event: it hands ready tasks to the workers and
// tells the source what the event paused or resumed.
func (r *Runner) settle() actions {
	r.dispatch()
	r.flushFlow()
	return r.take()
}

// actions is what the poll state asks of the world after an event. The
// Runner carries them out (carryOut) in the order of the fields.
type actions struct {
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

// take returns the actions the events since the last take asked for, and
// starts a new set. The slices of what it returns are reused: they are
// valid until the next call of a pollState method.
func (r *Runner) take() actions {
	a := r.acts
	r.acts = actions{replies: a.replies[:0], pause: a.pause[:0], resume: a.resume[:0]}
	return a
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
