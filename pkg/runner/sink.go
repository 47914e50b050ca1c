package runner

import (
	"context"
	"fmt"
	"time"
)

// sink kinds and the request that carries a Sink call to the loop.
type sinkKind uint8

const (
	sinkAssigned sinkKind = iota
	sinkRevoked
	sinkLost
	sinkFetched
	sinkOperator // not the source's: an operator's pause or resume (operator.go)
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
	op       *opCmd // sinkOperator's
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
	// An answer sent before the loop stopped wins over the stop: select
	// would pick either, and a Fetched refused for records the runner took
	// would have the source release (share) or refetch records that run.
	select {
	case rep := <-req.reply:
		return rep, rep.err
	case <-s.r.loopDone:
		select {
		case rep := <-req.reply:
			return rep, rep.err
		default:
			return sinkReply{}, ErrStopped
		}
	}
}

func (s sinkOf) Assigned(ctx context.Context, parts []Assignment) error {
	began := time.Now()
	var applied []Applied
	if h := s.r.cfg.assignHook; h != nil && len(parts) > 0 {
		var err error
		if applied, err = s.r.runHook(ctx, h, parts); err != nil {
			return err
		}
	}
	_, err := s.call(ctx, &sinkReq{kind: sinkAssigned, assigns: parts, applied: applied})
	if err == nil {
		s.r.member.record("assigned", assignedTPs(parts), assignedGeneration(parts), began, time.Now())
	}
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
		tm := time.NewTimer(r.backoff(attempt))
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
	began := time.Now()
	_, err := s.call(ctx, &sinkReq{kind: sinkLost, tps: tps})
	if err == nil {
		s.r.member.record("lost", tps, NoGeneration, began, time.Now())
	}
	return err
}

func (s sinkOf) Fetched(ctx context.Context, batches []Batch) (int, error) {
	rep, err := s.call(ctx, &sinkReq{kind: sinkFetched, batches: batches})
	return rep.budget, err
}

func (s sinkOf) Revoked(ctx context.Context, tps []TP, deadline time.Time) error {
	began := time.Now()
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
		s.r.member.record("revoked", tps, NoGeneration, began, time.Now())
		return err
	case <-s.r.loopDone:
		select {
		case err := <-req.replyErr: // answered before the loop stopped (see call)
			s.r.member.record("revoked", tps, NoGeneration, began, time.Now())
			return err
		default:
			return ErrStopped
		}
	}
}
