package runner

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// The worker's side of batch handlers: one batch under its topic's failure
// policy, as execute runs one record. The choice of a *BatchError over
// retrying the whole batch every time: a handler that applied the records
// before a bad one (each in its own transaction, or to a store that is not
// transactional) would apply them again on every retry of the whole batch,
// and at the policy's end the good records would be dead-lettered with the
// bad one. A handler that cannot tell which record failed returns any other
// error, and the whole batch is retried as one.

// finish sets res on the records of b not finished yet.
func (b *batch) finish(res result) {
	for _, t := range b.tasks[b.from:] {
		t.res = res
	}
	b.from = len(b.tasks)
}

// executeBatch runs a batch's handler under its topic's failure policy.
// Every attempt runs the part of the batch not finished yet (b.from on).
// The attempts are counted for that part's first record: a *BatchError
// that names a later record than the first starts the count again at 1,
// for that record, as does a record given up by the policy, for the
// records after it.
func (r *Runner) executeBatch(b *batch) {
	rt := b.route
	ctx, pr := r.tel.beginBatch(b.ps.ctx, b)
	defer pr.end(ctx)
	b.actx = attemptCtx{Context: ctx, attempt: 1}
	n := len(b.tasks)
	attempt, counted := 0, 0
	for b.from < n {
		attempt++
		actx := &b.actx
		if attempt > 1 {
			actx = &attemptCtx{Context: ctx, attempt: attempt}
		}
		err := r.batchAttempt(b, actx)
		if err == nil {
			for _, t := range b.tasks[b.from:] {
				t.res = resHandled
			}
			pr.handled(ctx, n-b.from)
			b.from = n
			return
		}
		cause, whole := err, true
		var be *BatchError
		if errors.As(err, &be) {
			if be.Index < 0 || be.Index >= n-b.from {
				r.log.Warn("BatchError index out of the batch; failing the whole batch", "record", b.tasks[b.from].rec.String(), "records", n-b.from, "index", be.Index, "err", err)
			} else {
				cause, whole = be.Err, false
				if cause == nil {
					cause = errBatchNilErr
				}
				if be.Index > 0 {
					// The records before it are handled; the count starts
					// again, at this failed attempt, for the record it names.
					for _, t := range b.tasks[b.from : b.from+be.Index] {
						t.res = resHandled
					}
					pr.handled(ctx, be.Index)
					b.from += be.Index
					attempt, counted = 1, 0
					b.firstFail = time.Time{}
				}
			}
		}
		rec := &b.tasks[b.from].rec
		if ctx.Err() != nil {
			// Lost, or the runner is closing: the rest stays incomplete.
			b.finish(resCancelled)
			pr.cancelled(cause)
			return
		}
		// The error's marks and sentinels are looked for in all of it: a
		// Permanent outside a *BatchError marks it as one inside does.
		// Its cause, the failed record's own error, is what the log and
		// the dead-letter headers name.
		if errors.Is(err, ErrFenced) {
			f := &failure{attempts: attempt, err: cause.Error()}
			for _, t := range b.tasks[b.from:] {
				t.fail.Store(f)
			}
			r.log.Warn("batch handler fenced by a newer owner; leaving the records to it", "record", rec.String(), "records", n-b.from, "err", cause)
			pr.fence(ctx, cause, n-b.from)
			b.finish(resFenced)
			return
		}
		kind := r.classify(rt, rec, err)
		now := time.Now()
		if b.firstFail.IsZero() {
			b.firstFail = now
		}
		b.lastFail = now
		// A BatchError names the one record that failed; the others
		// after it did not (they run again).
		failedN := n - b.from
		if !whole {
			failedN = 1
		}
		pr.failed(ctx, cause, failedN)
		f := &failure{attempts: attempt, err: cause.Error(), kind: kind}
		for _, t := range b.tasks[b.from:] {
			t.fail.Store(f)
		}
		if kind != TransientKind {
			counted++
		}
		pol := rt.policy
		// As in execute: an outcome unknown is never given up.
		end := pol.kind != policyBlock && !errors.Is(err, ErrOutcomeUnknown) &&
			(kind == PermanentKind || (kind == Retryable && counted >= pol.attempts))
		if !end {
			r.log.Warn("batch handler failed; retrying", "record", rec.String(), "records", n-b.from, "whole", whole, "attempt", attempt, "kind", kind.String(), "err", cause)
			if !r.sleep(ctx, rt, attempt) {
				b.finish(resCancelled)
				return
			}
			pr.retry(ctx, n-b.from)
			continue
		}
		// The policy's end for the record the BatchError named, or for
		// every record of the batch: each is dead-lettered with its own
		// headers, or skipped. The records after it run again.
		upto := n
		if !whole {
			upto = b.from + 1
		}
		for ; b.from < upto; b.from++ {
			t := b.tasks[b.from]
			if pol.kind == policySkip {
				r.log.Error("record skipped after its last attempt", "record", t.rec.String(), "attempts", attempt, "kind", kind.String(), "err", cause)
				pr.skip(ctx)
				t.res = resSkipped
				continue
			}
			if !r.deadLetter(ctx, t, cause, kind, attempts{n: attempt, first: b.firstFail, last: b.lastFail}) {
				b.finish(resCancelled)
				return
			}
			t.res = resDeadLettered
		}
		attempt, counted = 0, 0
		b.firstFail = time.Time{}
	}
}

var errBatchNilErr = errors.New("runner: BatchError with a nil Err")

// batchAttempt completes the records of b's part that the partition's
// Applied filter finds applied, then calls the handler once on the rest,
// with the per-attempt timeout. A panic in either is recovered into a
// *PanicError: a failed attempt of the whole part.
func (r *Runner) batchAttempt(b *batch, actx *attemptCtx) (err error) {
	where := "Applied filter"
	defer func() {
		if v := recover(); v != nil {
			pe := &PanicError{Record: b.tasks[b.from].rec.String(), In: where, Value: v, Stack: debug.Stack()}
			r.log.Error(where+" panicked", "record", pe.Record, "records", len(b.tasks)-b.from, "panic", fmt.Sprint(v), "stack", string(pe.Stack))
			err = pe
		}
	}()
	if f := b.ps.applied; f != nil {
		r.skipApplied(b, f)
		if b.from == len(b.tasks) {
			return nil
		}
	}
	where = "handler"
	rt := b.route
	if rt.timeout <= 0 {
		return checkedBatch(rt.batch(actx, b.recs[b.from:]))
	}
	ctx, cancel := rt.deadline(actx)
	defer cancel()
	return checkedBatch(rt.timedOut(ctx, &b.tasks[b.from].rec, rt.batch(ctx, b.recs[b.from:])))
}

// checkedBatch is checked for a batch's error, whose *BatchError's Err is
// the one the runner names (executeBatch).
func checkedBatch(err error) error {
	var be *BatchError
	if errors.As(checked(err), &be) {
		checked(be.Err)
	}
	return err
}

// skipApplied completes the records of b's part that f finds applied: they
// move to the front of the part, which then begins after them. f is asked
// about every record before b changes, so a panic in f leaves b as it was.
func (r *Runner) skipApplied(b *batch, f Applied) {
	rest := b.tasks[b.from:]
	var applied, keep []*task
	for i, t := range rest {
		switch {
		case f(t.rec.Offset):
			if applied == nil {
				keep = append(make([]*task, 0, len(rest)), rest[:i]...)
			}
			applied = append(applied, t)
		case applied != nil:
			keep = append(keep, t)
		}
	}
	if applied == nil {
		return
	}
	copy(rest, applied)
	copy(rest[len(applied):], keep)
	for i, t := range rest {
		b.recs[b.from+i] = t.rec
	}
	for _, t := range applied {
		t.res = resHandled
		r.tel.replaySkipped.Add(b.actx.Context, 1)
	}
	b.from += len(applied)
}
