package runner

import (
	"context"
	"hash/maphash"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

func (s *pollState) deliver(b *Batch) {
	ps := s.parts[b.TP]
	if ps == nil || ps.revoking {
		// Sources must not deliver for partitions they did not assign or
		// are revoking; dropping is safe because nothing was recorded.
		s.log.Warn("records for a partition not owned; dropped", "partition", b.TP.String(), "records", len(b.Records))
		return
	}
	rt := s.cfg.handlers[b.TP.Topic]
	if rt == nil {
		// No handler for this topic: fail loudly through the policy
		// rather than skip silently.
		rt = s.cfg.unrouted
	}
	batched := rt.batch != nil
	if batched && ps.batch == nil {
		ps.batch = &partBatch{route: rt}
	}
	now := s.now()
	for i := range b.Records {
		rec := &b.Records[i]
		if err := s.track(ps, rec); err != nil {
			// A redelivered or out-of-order offset: the first delivery is
			// tracked, so this copy is dropped, loudly.
			s.log.Warn("record delivered out of order; dropped", "record", rec.String(), "err", err)
			s.tel.outOfOrder.Add(context.Background(), 1, ps.tel.add...)
			continue
		}
		t := s.newTask()
		t.size = copyRecord(&t.rec, rec) + s.overhead + rt.extra
		t.route = rt
		t.ps = ps
		t.epoch = ps.epoch
		t.delivered = now
		ps.link(t)
		ps.count++
		ps.bytes += t.size
		s.totalCount++
		s.totalBytes += t.size
		s.countPeak = max(s.countPeak, s.totalCount)
		if batched {
			s.enqueueBatch(ps, t)
		} else {
			s.enqueue(ps, t)
		}
	}
	if batched {
		s.batchCheck(ps)
	}
	if n := len(b.Records); n > 0 && b.Records[n-1].Offset > ps.fetched {
		ps.fetched = b.Records[n-1].Offset
	}
	s.setRing(ps)
	if b.HighWatermark > ps.hwm {
		ps.hwm = b.HighWatermark
	}
	if b.Position > ps.pendingPos {
		ps.pendingPos = b.Position
		s.applyPosition(ps)
	}
	s.checkFlow(ps)
}

// enqueue puts t in its lane, or straight into the ready queue when its lane
// is idle or it has none.
func (s *pollState) enqueue(ps *partState, t *task) {
	l := s.laneOf(ps, t)
	t.lane = l
	if l == nil {
		s.ready.push(t)
		return
	}
	if l.busy {
		l.waiting.push(t)
		return
	}
	l.busy = true
	s.ready.push(t)
}

// laneOf returns t's lane by the ordering: its key's in KeyOrder (made, or
// taken back from the idle cache, as needed), its partition's in
// PartitionOrder, none for a nil key or in Unordered mode.
func (s *pollState) laneOf(ps *partState, t *task) *lane {
	switch s.cfg.ordering {
	case KeyOrder:
		if t.rec.Key == nil {
			return nil
		}
		h := maphash.Bytes(s.keySeed, t.rec.Key)
		l := ps.lanes[h]
		switch {
		case l == nil:
			l = s.newLane(ps, h)
			ps.lanes[h] = l
			ps.lanePeak = max(ps.lanePeak, len(ps.lanes))
		case !l.busy:
			s.unlinkIdle(l) // the key came back while its lane was cached
		}
		return l
	case PartitionOrder:
		return ps.lane
	}
	return nil
}

// dispatch moves ready tasks to the actions' work, for the workers' queue,
// while fewer than Concurrency tasks are queued or running.
func (s *pollState) dispatch() {
	if s.cfg.batched {
		s.dispatchMixed()
		return
	}
	var out queue // what this dispatch hands to the workers
	for s.inflight < s.cfg.concurrency {
		t := s.ready.pop()
		if t == nil {
			break
		}
		if t.dropped {
			s.freeTask(t)
			continue
		}
		t.started = true
		t.ps.inflight++
		s.inflight++
		out.push(t)
	}
	if out.n > 0 {
		s.acts.work.add(out.head, out.tail, out.n)
	}
}

// onFinished takes back the finished tasks linked from t through nextQ.
func (s *pollState) onFinished(t *task) {
	for t != nil {
		next := t.nextQ
		if t.batch != nil {
			s.onBatchDone(t.batch)
		} else {
			s.onDone(t)
		}
		t = next
	}
}

// onDone takes a finished task back from a worker.
func (s *pollState) onDone(t *task) {
	ps := t.ps
	s.inflight--
	ps.inflight--
	ps.count--
	ps.bytes -= t.size
	s.totalCount--
	s.totalBytes -= t.size
	ps.unlink(t)
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
		// The safe offset never passes it in this assignment: remember
		// it for the oldest-unfinished stats.
		ps.fencedOff, ps.fencedAt, ps.fencedErr = t.rec.Offset, t.delivered, t.failure()
		ps.fencedKey = printableKey(t.rec.Key)
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
				s.heldBytes += laneCharge
			}
		} else if next := l.waiting.pop(); next != nil {
			s.ready.push(next)
		} else {
			l.busy = false
			if s.cfg.ordering == KeyOrder {
				// An idle key lane stays in the map, a cache for a key
				// that comes back, as long as the idle lanes fit.
				s.pushIdle(l)
				s.fitIdle()
			}
		}
	}
	s.freeTask(t)
	if !ps.closed {
		s.checkFlow(ps)
	} else {
		s.checkGlobal()
	}
	if ps.revoking && ps.inflight == 0 {
		s.checkDrains()
	}
}

// applyPosition moves the safe offset to the fetch position once nothing
// delivered is outstanding, so lag reaches zero past control records.
func (s *pollState) applyPosition(ps *partState) {
	if ps.pendingPos < 0 || ps.p.Tracker().Outstanding() > 0 {
		return
	}
	ps.p.Position(ps.epoch, ps.pendingPos)
	ps.pendingPos = -1
}
