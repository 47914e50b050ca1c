package runner

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// The poll goroutine's side of batch handlers: which records of a
// partition are ready to join a batch, when a partition's batch is due,
// forming it, and taking it back.
//
// A batch route's records go through their lanes as single records do,
// with one difference: a record whose lane is idle does not go to the
// runner's ready queue but to its partition's (partBatch.ready), and the
// records waiting in its lane behind it are ready too, until a batch takes
// the lane. A batch takes lanes from the partition's ready queue, oldest
// first, and from each as many of its records as fit, in offset order; the
// lanes it took are in flight (lane.flying) until it returns, so no later
// record of their keys runs before it, and their records left behind wait.

// partBatch is a batch route's partition state (partState.batch).
type partBatch struct {
	route *route
	// ready holds records whose lane was idle (or who have none), in the
	// order they became ready; avail counts them and the records waiting
	// in their lanes: what a batch could take now.
	ready queue
	avail int
	// since is when avail last became positive (zero while it is 0): the
	// first of the ready records has waited since then.
	since            time.Time
	queued, lingered bool // in pollState.batchDue, in pollState.lingering
}

// enqueueBatch is enqueue for a batch route's record t.
func (s *pollState) enqueueBatch(ps *partState, t *task) {
	pb := ps.batch
	l := s.laneOf(ps, t)
	t.lane = l
	switch {
	case l == nil:
		pb.ready.push(t)
		pb.avail++
	case l.flying:
		l.waiting.push(t) // behind a batch in flight (or a fenced record)
	case l.busy:
		l.waiting.push(t) // behind the lane's ready head
		pb.avail++
	default:
		l.busy = true
		pb.ready.push(t)
		pb.avail++
	}
}

// batchCheck puts ps in the queue of partitions whose batch is due when
// it is — BatchSize records are ready, the first has waited BatchWait, or
// BatchWait is 0 — and otherwise in the lingering list, with the linger
// timer set for when the first will have waited BatchWait.
func (s *pollState) batchCheck(ps *partState) {
	pb := ps.batch
	if pb == nil || pb.avail == 0 || pb.queued || ps.revoking || ps.closed {
		return
	}
	rt := pb.route
	if pb.avail >= rt.batchSize || rt.batchWait == 0 {
		s.queueBatch(ps)
		return
	}
	now := s.now()
	if pb.since.IsZero() {
		pb.since = now
	}
	due := pb.since.Add(rt.batchWait)
	if !now.Before(due) {
		s.queueBatch(ps)
		return
	}
	if !pb.lingered {
		pb.lingered = true
		s.lingering = append(s.lingering, ps)
	}
	s.armLinger(due)
}

func (s *pollState) queueBatch(ps *partState) {
	ps.batch.queued = true
	s.batchDue = append(s.batchDue, ps)
}

// armLinger has the linger timer fire at due, unless it fires before.
func (s *pollState) armLinger(due time.Time) {
	if s.lingerAt.IsZero() || due.Before(s.lingerAt) {
		s.lingerAt = due
		s.acts.lingerAt = due
	}
}

// lingerDue moves the lingering partitions whose first ready record has
// waited BatchWait to the queue of due batches, and sets the timer for the
// next.
func (s *pollState) lingerDue() {
	s.lingerAt = time.Time{}
	now := s.now()
	var next time.Time
	keep := s.lingering[:0]
	for _, ps := range s.lingering {
		pb := ps.batch
		if pb.queued || pb.avail == 0 || ps.revoking || ps.closed {
			pb.lingered = false
			continue
		}
		due := pb.since.Add(pb.route.batchWait)
		if !now.Before(due) {
			pb.lingered = false
			s.queueBatch(ps)
			continue
		}
		keep = append(keep, ps)
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	clear(s.lingering[len(keep):])
	s.lingering = keep
	if !next.IsZero() {
		s.armLinger(next)
	}
}

// dispatchMixed is dispatch for a runner with batch routes: it takes
// single records from the ready queue and batches from the due queue in
// turn, so neither starves the other, while fewer than Concurrency handler
// calls are queued or running (a batch is one call).
func (s *pollState) dispatchMixed() {
	var out queue // what this dispatch hands to the workers
	for s.inflight-s.batchExtra < s.cfg.concurrency {
		s.batchTurn = !s.batchTurn
		var t *task
		if s.batchTurn {
			if t = s.formBatch(); t == nil {
				t = s.readyTask()
			}
		} else if t = s.readyTask(); t == nil {
			t = s.formBatch()
		}
		if t == nil {
			break
		}
		out.push(t)
	}
	if out.n > 0 {
		s.acts.work.add(out.head, out.tail, out.n)
	}
}

// readyTask takes the next single record from the ready queue for a
// worker, or returns nil.
func (s *pollState) readyTask() *task {
	for {
		t := s.ready.pop()
		if t == nil {
			return nil
		}
		if t.dropped {
			s.freeTask(t)
			continue
		}
		t.started = true
		t.ps.inflight++
		s.inflight++
		return t
	}
}

// formBatch forms the batch of the first partition in the due queue that
// still has ready records and returns its first task, or nil.
func (s *pollState) formBatch() *task {
	for len(s.batchDue) > 0 {
		ps := s.batchDue[0]
		s.batchDue[0] = nil
		s.batchDue = s.batchDue[1:]
		if len(s.batchDue) == 0 {
			s.batchDue = s.batchDue[:0:0] // let the array go; it regrows from nothing
		}
		pb := ps.batch
		pb.queued = false
		if pb.avail == 0 || ps.revoking || ps.closed {
			continue
		}
		return s.take(ps)
	}
	return nil
}

// take forms a batch of ps's ready records: lanes from its ready queue,
// oldest first, and from each as many of its records as fit, in offset
// order.
func (s *pollState) take(ps *partState) *task {
	pb := ps.batch
	rt := pb.route
	n := min(pb.avail, rt.batchSize)
	b := &batch{ps: ps, route: rt, tasks: make([]*task, 0, n)}
	switch s.cfg.ordering {
	case KeyOrder:
		b.lanes = make([]*lane, 0, n) // sized once: growing it would cost more than batchRecordOverhead
	case PartitionOrder:
		b.lanes = make([]*lane, 0, 1)
	}
	for len(b.tasks) < n {
		t := pb.ready.pop()
		if t == nil {
			break // cannot be: avail counts what ready holds
		}
		pb.avail--
		b.tasks = append(b.tasks, t)
		if l := t.lane; l != nil {
			// The lane is in flight now: what waits in it is not ready
			// any more, but what fits joins the batch.
			l.flying = true
			b.lanes = append(b.lanes, l)
			pb.avail -= l.waiting.n
			for len(b.tasks) < n {
				w := l.waiting.pop()
				if w == nil {
					break
				}
				b.tasks = append(b.tasks, w)
			}
		}
	}
	if len(b.lanes) > 1 {
		// Several lanes: their records interleave in the partition.
		slices.SortFunc(b.tasks, func(x, y *task) int { return cmp.Compare(x.rec.Offset, y.rec.Offset) })
	}
	b.recs = make([]Record, len(b.tasks))
	for i, t := range b.tasks {
		t.started = true
		b.recs[i] = t.rec
	}
	k := len(b.tasks)
	ps.inflight += k
	s.inflight += k
	s.batchExtra += k - 1
	b.tasks[0].batch = b
	s.tel.batchSize.Record(context.Background(), int64(k), s.tel.topicAttrs[rt.topic].rec...)
	if pb.avail == 0 {
		pb.since = time.Time{}
	} else {
		// What is left keeps its wait: it has been ready since pb.since
		// at the latest, and waits no longer than BatchWait from then.
		s.batchCheck(ps)
	}
	return b.tasks[0]
}

// onBatchDone takes a finished batch back from a worker: each of its
// records completes (or not) as a single record does in onDone, and then
// the lanes it took are released, or held by a fenced record.
func (s *pollState) onBatchDone(b *batch) {
	ps := b.ps
	k := len(b.tasks)
	s.inflight -= k
	s.batchExtra -= k - 1
	ps.inflight -= k
	for _, t := range b.tasks {
		ps.count--
		ps.bytes -= t.size
		s.totalCount--
		s.totalBytes -= t.size
		ps.unlink(t)
		s.complete(ps, t)
		if t.res == resFenced && !ps.closed && t.lane != nil && !t.lane.held {
			t.lane.held = true
			ps.held++
			s.heldBytes += laneCharge
		}
	}
	if !ps.closed {
		pb := ps.batch
		for _, l := range b.lanes {
			if l.held {
				continue // stays in flight until the assignment ends (see onDone)
			}
			l.flying = false
			if next := l.waiting.pop(); next != nil {
				pb.ready.push(next)
				pb.avail += 1 + l.waiting.n
				continue
			}
			l.busy = false
			if s.cfg.ordering == KeyOrder {
				s.pushIdle(l)
			}
		}
		s.fitIdle()
	}
	for _, t := range b.tasks {
		s.freeTask(t)
	}
	if !ps.closed {
		s.batchCheck(ps)
		s.checkFlow(ps)
	} else {
		s.checkGlobal()
	}
	if ps.revoking && ps.inflight == 0 {
		s.checkDrains()
	}
}

// complete is onDone's completion of one record t of ps: the tracker
// learns it unless it did not finish, and a fenced record is remembered.
func (s *pollState) complete(ps *partState, t *task) {
	if t.res != resHandled {
		ps.countResult(t)
	}
	if !s.settleDone(t) && t.res != resCancelled && t.res != resFenced {
		switch ps.p.Complete(t.epoch, t.rec.Offset) {
		case rebalance.Advanced:
			s.applyPosition(ps)
		case rebalance.OldAssignment, rebalance.NotOwner:
			s.tel.stale.Add(context.Background(), 1, ps.tel.add...)
		}
	}
	if t.res == resFenced && !ps.closed && (ps.fencedOff < 0 || t.rec.Offset < ps.fencedOff) {
		ps.fencedOff, ps.fencedAt, ps.fencedErr = t.rec.Offset, t.delivered, t.failure()
		ps.fencedKey = printableKey(t.rec.Key)
	}
}

// dropBatchReady ends, for a partition whose dispatch stopped, what its
// batch state holds: the records in its ready queue were dropped with the
// rest of those not started (stopDispatch) and are freed here.
func (s *pollState) dropBatchReady(ps *partState) {
	pb := ps.batch
	if pb == nil {
		return
	}
	for t := pb.ready.pop(); t != nil; t = pb.ready.pop() {
		s.freeTask(t)
	}
	pb.avail = 0
	pb.since = time.Time{}
}
