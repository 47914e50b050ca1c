package runner

import (
	"context"
	"errors"
	"time"
)

func (r *Runner) loop(ctx context.Context, srcDone <-chan struct{}, srcErr *error) error {
	defer r.publishStopped() // however the loop ends
	ticker := time.NewTicker(r.cfg.commitInterval)
	defer ticker.Stop()
	r.drainTimer = time.NewTimer(time.Hour)
	r.drainTimer.Stop()
	defer r.lingerTimer.Stop()
	ctxDone := ctx.Done()
	var stopCtxDone <-chan struct{}
	for !r.poll.finished {
		var a *actions
		select {
		case req := <-r.sinkCh:
			a = r.poll.reported(req)
			if req.kind == sinkOperator {
				// Refresh the snapshot before answering: a status page
				// that redirects to itself after a pause must show it,
				// not the stats of up to a commit interval before.
				ans := a.answer
				a.answer = reply{}
				r.carryOut(a)
				r.carryOut(r.poll.settle())
				r.publishStats()
				ans.send()
				continue
			}
		case <-r.doneq.signal:
			a = r.poll.tasksFinished(r.doneq.take())
		case c := <-r.commitRes:
			a = r.poll.committed(c)
		case <-ticker.C:
			r.publishStats()
			a = r.poll.ticked()
		case <-r.drainTimer.C:
			a = r.poll.drainDue()
		case <-r.lingerTimer.C:
			a = r.poll.lingerFired()
		case s := <-r.stopCh:
			stopCtxDone = s.ctxDone
			a = r.poll.stop(s.drainDeadline, s.deadline, s.ctxDone != nil)
		case <-ctxDone:
			ctxDone = nil
			a = r.poll.stop(time.Now().Add(r.cfg.drainBudget), time.Time{}, false)
		case <-stopCtxDone:
			stopCtxDone = nil
			a = r.poll.shutdownCtxDone()
		case <-r.closeCh:
			if r.poll.stopping {
				// A graceful stop was under way and its final commit was
				// not acknowledged (the loop would have returned).
				return &FinalCommitError{Err: errClosedInStop}
			}
			return nil
		case <-srcDone:
			// srcErr is written before srcDone is closed.
			err := *srcErr
			if err == nil && r.poll.stopping {
				srcDone = nil
				continue
			}
			if err == nil {
				err = errors.New("runner: source stopped without an error before the runner did")
			}
			r.log.Error("source failed; stopping without a final commit", "err", err)
			return err
		}
		r.carryOut(a)
		r.carryOut(r.poll.settle())
	}
	return r.poll.drainErr
}

// carryOut does what the poll state asked for, in the order of the fields
// of actions, and resets a.
func (r *Runner) carryOut(a *actions) {
	for _, st := range a.settlements {
		r.settler.Settle(st.tp, st.offset, st.s)
		r.poll.tel.settledAs(st.tp.Topic, st.s)
	}
	for _, rp := range a.replies {
		rp.send()
	}
	if a.commit != nil {
		r.commitReq <- a.commit // capacity 1 and at most one in flight: never blocks
	}
	if a.work.n > 0 {
		r.workq.push(a.work.head, a.work.tail, a.work.n)
	}
	if len(a.pause) > 0 {
		r.src.Pause(a.pause)
	}
	if len(a.resume) > 0 {
		r.src.Resume(a.resume)
	}
	a.answer.send()
	if !a.drainAt.IsZero() {
		r.drainTimer.Reset(time.Until(a.drainAt))
	}
	if !a.lingerAt.IsZero() {
		r.lingerTimer.Reset(time.Until(a.lingerAt))
	}
	a.reset()
}

// onSink acts on one report from the source and answers it.
func (s *pollState) onSink(req *sinkReq) {
	if s.stopping && req.kind != sinkLost && req.kind != sinkRevoked {
		s.acts.replies = append(s.acts.replies, reply{to: req.reply, rep: sinkReply{err: ErrStopped}})
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
			replaced = s.assign(a, f) || replaced
		}
		s.checkDrains() // an assignment can replace (lose) a partition a drain waits on
		s.flushFlow()   // under the global cap, new partitions start paused
		if replaced && s.committing != nil {
			// The replaced assignments were lost: answer as for Lost, once
			// a commit built for them can no longer reach the source.
			s.afterCommit = append(s.afterCommit, req.reply)
			return
		}
		s.acts.answer = reply{to: req.reply} // after the pause
	case sinkFetched:
		for i := range req.batches {
			s.deliver(&req.batches[i])
		}
		s.fitFree()
		// Pause before answering: the source's next poll must already
		// leave out the partitions at their high water mark. Answer before
		// dispatching (the loop dispatches right after), so the source's
		// next poll overlaps the dispatch.
		s.flushFlow()
		s.acts.answer = reply{to: req.reply, rep: sinkReply{budget: s.budget()}}
	case sinkLost:
		for _, tp := range req.tps {
			s.lose(tp)
		}
		s.checkDrains()
		if s.committing != nil {
			// A commit built before the loss may still be on its way to
			// the source. Answer only after it was answered, so the
			// source cannot rejoin, get the partition back and then send
			// that old offset under the new generation.
			s.afterCommit = append(s.afterCommit, req.reply)
			return
		}
		s.acts.replies = append(s.acts.replies, reply{to: req.reply})
	case sinkRevoked:
		deadline := s.now().Add(s.cfg.drainBudget)
		if !req.deadline.IsZero() && req.deadline.Before(deadline) {
			deadline = req.deadline
		}
		d := &drain{deadline: deadline, reply: req.replyErr, began: s.now()}
		for _, tp := range req.tps {
			// A partition already draining (a shutdown) joins this drain
			// too, so the source waits for its final commit.
			if ps := s.parts[tp]; ps != nil {
				d.parts = append(d.parts, ps)
				if !ps.revoking {
					s.stopDispatch(ps)
				}
			}
		}
		if len(d.parts) == 0 {
			s.acts.replies = append(s.acts.replies, reply{toErr: req.replyErr})
			return
		}
		s.tel.revoke()
		s.drains = append(s.drains, d)
		s.checkDrains()
	case sinkOperator:
		s.operate(req)
	}
}

// assign sets up a new assignment of a.TP; it reports whether it replaced
// one the runner still held (which it drops as lost).
func (s *pollState) assign(a Assignment, applied Applied) (replaced bool) {
	if old := s.parts[a.TP]; old != nil {
		// A source reporting an assignment it already gave us has lost
		// track; treat the old assignment as lost (never commit for it).
		s.log.Warn("partition assigned again without a revoke; dropping the old assignment", "partition", a.TP.String())
		s.lose(a.TP)
		replaced = true
	}
	p := s.table.Assign(a.TP, a.Start)
	ctx, cancel := context.WithCancel(s.handlerCtx)
	ps := &partState{p: p, epoch: p.Epoch(), tp: a.TP, ctx: ctx, cancel: cancel, pendingPos: -1, hwm: -1, applied: applied,
		band: -1, fencedOff: -1, fetched: -1, keyOff: -1, tel: s.tel.partition(a.TP)}
	switch s.cfg.ordering {
	case KeyOrder:
		ps.lanes = map[uint64]*lane{}
	case PartitionOrder:
		ps.lane = &lane{}
	}
	ps.first = attemptCtx{Context: ctx, attempt: 1}
	s.parts[a.TP] = ps
	ps.opPaused = s.ops.paused(a.TP)
	if s.globalPaused || ps.opPaused {
		s.flowDirty = append(s.flowDirty, ps)
	}
	s.log.Debug("partition assigned", "partition", a.TP.String(), "epoch", uint64(ps.epoch), "start", a.Start,
		"generation", a.Generation, "member", a.Member)
	return replaced
}

func (s *pollState) lose(tp TP) {
	ps := s.parts[tp]
	if ps == nil {
		return
	}
	s.stopDispatch(ps)
	s.table.Lose(tp)
	ps.closed = true
	ps.cancel()
	s.release(ps)
	delete(s.parts, tp)
	s.tel.partitionLost(ps)
	s.log.Warn("partition lost; nothing will be committed for it", "partition", tp.String(), "epoch", uint64(ps.epoch), "in_flight", ps.inflight)
	// Its bytes left the total: the global cap may lift. Drains waiting on
	// it are checked by the caller, once every partition of the report is
	// gone: checking here could send a final commit for a partition lost in
	// the same report.
	s.checkGlobal()
}
