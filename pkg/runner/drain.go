package runner

import (
	"errors"
	"time"
)

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
	// untilCtx is set on a shutdown's drain that ends with Shutdown's ctx
	// too, and ctxEnded once that ctx ended (shutdownEnded).
	untilCtx, ctxEnded bool
	reply              chan error // nil for a shutdown
	began              time.Time  // when the revoke was reported (tidemark.revoke.duration)
	stop               bool
	ready              bool // drained or out of time: waiting for its final commit
}

// stopDispatch starts a partition's drain: records that have not started are
// dropped (they will be replayed by the next owner), in-flight ones go on.
func (s *pollState) stopDispatch(ps *partState) {
	ps.revoking = true
	ps.draining.Store(true)
	for _, l := range ps.lanes {
		s.dropWaiting(ps, l)
	}
	if ps.lane != nil {
		s.dropWaiting(ps, ps.lane)
	}
	for t := ps.oldest; t != nil; {
		next := t.next
		if !t.started && !t.dropped {
			// In the ready queue: mark it; dispatch frees it. Its lane
			// has nothing else (what waited in it was dropped above): it
			// is idle, like the lane of a record that finished.
			s.drop(ps, t)
			if l := t.lane; l != nil && !l.held {
				l.busy = false
				if s.cfg.ordering == KeyOrder {
					s.pushIdle(l)
				}
			}
		}
		t = next
	}
	s.dropBatchReady(ps)
	s.fitIdle()
	if ps.paused {
		ps.paused = false
		s.flowDirty = append(s.flowDirty, ps)
	}
	s.setBand(ps)
	s.checkGlobal()
}

func (s *pollState) dropWaiting(ps *partState, l *lane) {
	for t := l.waiting.pop(); t != nil; t = l.waiting.pop() {
		s.drop(ps, t)
		s.freeTask(t)
	}
}

func (s *pollState) drop(ps *partState, t *task) {
	s.settleDropped(t)
	t.dropped = true
	ps.unlink(t)
	ps.count--
	ps.bytes -= t.size
	s.totalCount--
	s.totalBytes -= t.size
}

// beginStop starts a graceful stop: a drain of every partition until
// deadline (zero: none) or, if untilCtx, until Shutdown's ctx ends
// (shutdownEnded), then a final commit bounded by commitBy (zero:
// CommitTimeout alone). A stop already under way is tightened instead
// (tightenStop).
func (s *pollState) beginStop(deadline, commitBy time.Time, untilCtx bool) {
	if s.stopping {
		s.tightenStop(deadline, commitBy, untilCtx)
		return
	}
	s.stopping = true
	s.log.Info("stopping: draining in-flight handlers", "partitions", len(s.parts), "in_flight", s.inflight, "deadline", deadline)
	d := &drain{deadline: deadline, commitBy: commitBy, untilCtx: untilCtx, stop: true}
	for _, ps := range s.parts {
		// A partition already draining for a revoke joins the stop drain
		// too: the stop must not end before that revoke's handlers did.
		d.parts = append(d.parts, ps)
		if !ps.revoking {
			s.stopDispatch(ps)
		}
		// Pause every partition (flushFlow pauses all while stopping):
		// a share source that polled again would acquire records only
		// to release them, raising their delivery counts.
		s.flowDirty = append(s.flowDirty, ps)
	}
	s.drains = append(s.drains, d)
	s.checkDrains()
}

// tightenStop applies a second stop request (Run's ctx ended and Shutdown
// was called: one SIGTERM can do both) to the stop under way: its drain
// ends at the earlier of the two deadlines, its final commit is bounded by
// the earlier commitBy, and it ends with a Shutdown's ctx if either did.
// The rule is symmetric, so the result does not depend on which request
// the loop saw first. A final commit already sent keeps its bound
// (CommitTimeout); Shutdown's ctx still ends it, with Close.
func (s *pollState) tightenStop(deadline, commitBy time.Time, untilCtx bool) {
	for _, d := range s.drains {
		if !d.stop {
			continue
		}
		d.deadline = earlier(d.deadline, deadline)
		d.commitBy = earlier(d.commitBy, commitBy)
		d.untilCtx = d.untilCtx || untilCtx
		s.log.Info("stopping: a second stop request", "deadline", d.deadline, "final_commit_by", d.commitBy)
	}
	s.checkDrains()
}

// earlier returns the earlier of a and b, a zero time meaning none.
func earlier(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// checkDrains marks drains whose partitions are idle (or whose time is up)
// ready, and starts the final commit when the committer is free.
func (s *pollState) checkDrains() {
	now := s.now()
	var next time.Time
	for _, d := range s.drains {
		if d.ready {
			continue
		}
		expired := !d.deadline.IsZero() && !now.Before(d.deadline) || d.ctxEnded
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
		s.acts.drainAt = next
	}
	s.finalCommit()
}

// shutdownEnded ends the drain of a shutdown whose ctx ended: its time is
// up.
func (s *pollState) shutdownEnded() {
	for _, d := range s.drains {
		if d.untilCtx {
			d.ctxEnded = true
		}
	}
	s.checkDrains()
}

// finalCommit sends one synchronous commit for every ready drain once no
// other commit is in flight (commits are sequenced, one at a time).
func (s *pollState) finalCommit() {
	if s.committing != nil {
		return
	}
	var ready []*drain
	rest := s.drains[:0]
	for _, d := range s.drains {
		if d.ready {
			ready = append(ready, d)
		} else {
			rest = append(rest, d)
		}
	}
	if len(ready) == 0 {
		return
	}
	s.drains = rest
	// The drain's time may be up: the final commit gets its own
	// CommitTimeout, within what is left of Shutdown's budget.
	var by time.Time
	for _, d := range ready {
		if !d.commitBy.IsZero() && (by.IsZero() || d.commitBy.Before(by)) {
			by = d.commitBy
		}
	}
	c := s.newCommit(by)
	c.drains = ready
	if len(c.offsets) == 0 {
		s.finishDrains(ready, nil)
		return
	}
	s.send(c)
}

// finishDrains ends drains after their final commit, ending the epochs of
// their partitions and answering the source; commitErr is that commit's
// failure, reported with each drain's result.
func (s *pollState) finishDrains(ds []*drain, commitErr error) {
	for _, d := range ds {
		unfinished := map[TP]int64{}
		var took time.Duration
		if !d.stop {
			took = s.now().Sub(d.began)
		}
		for _, ps := range d.parts {
			if ps.closed {
				continue // lost, or assigned anew, while draining
			}
			tp := ps.tp
			if ps.inflight > 0 {
				unfinished[tp] = s.firstUnfinished(ps)
			}
			if !d.stop {
				s.tel.revoked(ps, took)
			}
			final, _ := s.table.Revoke(tp)
			ps.closed = true
			ps.cancel()
			s.release(ps)
			delete(s.parts, tp)
			if s.settled {
				// Nothing is revoked or committed: the source releases what
				// still runs on Close.
				s.log.Info("partition stopped", "partition", tp.String(), "unfinished", ps.inflight)
			} else {
				s.log.Info("partition revoked", "partition", tp.String(), "epoch", uint64(ps.epoch), "safe", final, "acknowledged", ps.p.Acknowledged(), "unfinished", ps.inflight)
			}
		}
		var err error
		if len(unfinished) > 0 {
			err = &DrainError{Unfinished: unfinished}
			s.log.Warn("drain budget ran out", "err", err)
		}
		if commitErr != nil {
			err = errors.Join(err, commitErr)
		}
		if d.stop {
			s.drainErr = err
			s.finished = true
		} else {
			s.acts.replies = append(s.acts.replies, reply{toErr: d.reply, rep: sinkReply{err: err}})
		}
	}
}
