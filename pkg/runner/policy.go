package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/tidemark/tidemark/internal/backoff"
)

// PanicError is a panic in user code turned into a failed attempt: in the
// handler, in the assign hook's Applied filter (checked at the start of
// every attempt), or in the DeadLetterWriter (a failed write, retried). The
// runner recovers panics instead of letting them crash the process (unlike
// errgroup, which leaves them alone) because one poison record must not take
// down every partition of the member: the panic is handled exactly like an
// error, by the failure policy, with its stack kept for the log.
type PanicError struct {
	Record string // topic/partition@offset
	// In names the code that panicked: "handler", "Applied filter" or
	// "DeadLetterWriter".
	In    string
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("runner: %s panicked on %s: %v", e.In, e.Record, e.Value)
}

// Unwrap returns the panic's value when it is an error, so that a panic
// with a marked error (panic(runner.Permanent(err))) is classified by its
// mark, and errors.Is and errors.As see what was thrown.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// execute runs one record's handler under its topic's failure policy.
func (r *Runner) execute(t *task) {
	rt := t.route
	rec := &t.rec
	ctx, pr := r.tel.begin(t.ps.ctx, t)
	defer pr.end(ctx)
	counted := 0              // attempts counted against the policy's
	var first, last time.Time // when the first and the last failed attempt ended
	for attempt := 1; ; attempt++ {
		applied, err := r.attempt(attemptContext(ctx, t.ps, attempt), t)
		if err == nil && applied {
			// Applied before (a replay after a restart or a handoff):
			// complete it without running the handler again.
			t.res = resHandled
			pr.replaySkip(ctx)
			return
		}
		if err == nil {
			t.res = resHandled
			pr.handled(ctx, 1)
			return
		}
		if ctx.Err() != nil {
			// The partition was lost, or the runner is closing: the record
			// stays incomplete and is replayed by whoever owns it next.
			t.res = resCancelled
			pr.cancelled(err)
			return
		}
		if errors.Is(err, ErrFenced) {
			t.fail.Store(&failure{attempts: attempt, err: err.Error()})
			r.log.Warn("handler fenced by a newer owner; leaving the record to it", "record", rec.String(), "err", err)
			pr.fence(ctx, err, 1)
			t.res = resFenced
			return
		}
		kind := r.classify(rt, rec, err)
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		pr.failed(ctx, err, 1)
		t.fail.Store(&failure{attempts: attempt, err: err.Error(), kind: kind})
		if kind != TransientKind {
			counted++
		}
		pol := rt.policy
		// An attempt whose outcome is unknown may have been applied:
		// skipping or dead-lettering it could report an applied record as
		// failed, so it is retried as under Block, whatever its kind.
		end := pol.kind != policyBlock && !errors.Is(err, ErrOutcomeUnknown) &&
			(kind == PermanentKind || (kind == Retryable && counted >= pol.attempts))
		if end {
			if pol.kind == policySkip {
				r.log.Error("record skipped after its last attempt", "record", rec.String(), "attempts", attempt, "kind", kind.String(), "err", err)
				pr.skip(ctx)
				t.res = resSkipped
				return
			}
			if r.deadLetter(ctx, t, err, kind, attempts{n: attempt, first: first, last: last}) {
				t.res = resDeadLettered
			} else {
				t.res = resCancelled
			}
			return
		}
		r.log.Warn("handler failed; retrying", "record", rec.String(), "attempt", attempt, "kind", kind.String(), "err", err)
		if !r.sleep(ctx, rt, attempt) {
			t.res = resCancelled
			return
		}
		pr.retry(ctx, 1)
	}
}

// classify returns the kind of a failed attempt's error by the route's
// classifier. A classifier that panics, or returns a kind the runner does
// not know, makes the error Retryable, the default, rather than take down
// the worker or hold the record forever under any policy.
func (r *Runner) classify(rt *route, rec *Record, err error) (kind ErrorKind) {
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("Classifier panicked; counting the error as retryable", "record", rec.String(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			kind = Retryable
		}
	}()
	kind = rt.classify(err)
	if kind > PermanentKind {
		r.log.Error("Classifier returned an unknown ErrorKind; counting the error as retryable", "record", rec.String(), "kind", int(kind))
		kind = Retryable
	}
	return kind
}

// attempt asks the partition's Applied filter, if any, whether the record
// was applied before (applied true: the handler is not called), and
// otherwise calls the handler once, with the per-attempt timeout. A panic in
// either is recovered into a *PanicError: a failed attempt.
func (r *Runner) attempt(ctx context.Context, t *task) (applied bool, err error) {
	where := "Applied filter"
	defer func() {
		if v := recover(); v != nil {
			pe := &PanicError{Record: t.rec.String(), In: where, Value: v, Stack: debug.Stack()}
			r.log.Error(where+" panicked", "record", pe.Record, "panic", fmt.Sprint(v), "stack", string(pe.Stack))
			applied, err = false, pe
		}
	}()
	if f := t.ps.applied; f != nil && f(t.rec.Offset) {
		return true, nil
	}
	where = "handler"
	rt := t.route
	if rt.timeout <= 0 {
		return false, checked(rt.handler(ctx, t.rec))
	}
	ctx, cancel := rt.deadline(ctx)
	defer cancel()
	return false, checked(rt.timedOut(ctx, &t.rec, rt.handler(ctx, t.rec)))
}

// checked returns err after calling its Error method once, so that an
// error whose Error panics (a nil *T returned as an error, the classic
// typed nil) panics here, inside the attempt's recover, and becomes a
// *PanicError of the handler's: the runner, its logs and the dead-letter
// headers call Error again outside any recover.
func checked(err error) error {
	if err != nil {
		_ = err.Error()
	}
	return err
}

// sleep waits rt's backoff before attempt+1; false if ctx ended first.
func (r *Runner) sleep(ctx context.Context, rt *route, attempt int) bool {
	d := backoff.Jittered(rt.backoffInitial, rt.backoffMax, attempt)
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff is the wait before attempt+1 of a record, a dead-letter write or
// the assign hook: exponential from Backoff's initial wait up to its max,
// with equal jitter (uniform in [d/2, d]) so that retries of many records
// do not synchronize.
func (r *Runner) backoff(attempt int) time.Duration {
	return backoff.Jittered(r.cfg.backoffInitial, r.cfg.backoffMax, attempt)
}

// attempts are a record's attempts when it is given up: how many, and when
// the first and the last failed attempt ended (the dead-letter headers).
// They live on the worker's stack, not in the task, which every record
// pays for.
type attempts struct {
	n           int
	first, last time.Time
}

// deadLetter writes the record to its route's dead-letter topic, with the
// dead-letter headers (deadletter.go), retrying with backoff until the
// write is acknowledged; false if ctx ended first.
func (r *Runner) deadLetter(ctx context.Context, t *task, cause error, kind ErrorKind, a attempts) bool {
	rt := t.route
	rec := t.rec
	rec.Headers = deadLetterHeaders(&t.rec, r.group, cause, kind, a.n, a.first, a.last)
	cuts := 0
	for i := 1; ; i++ {
		err := r.writeDeadLetter(ctx, rt, rec)
		if err == nil {
			r.log.Error("record dead-lettered", "record", t.rec.String(), "topic", rt.policy.topic, "attempts", a.n, "kind", kind.String(), "err", cause, "cut", cuts > 0)
			r.tel.deadLetter(ctx, t)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		var refused *RefusedError
		if errors.As(err, &refused) {
			r.tel.deadLetterRefused(ctx, t, cuts)
			if cuts < 2 {
				// Retrying the same bytes cannot succeed: a smaller dead
				// letter, at once.
				cuts++
				what := "the record's value and headers"
				if cuts == 2 {
					what += " and key"
				}
				r.log.Warn("dead letter refused by the broker; writing it without "+what, "record", t.rec.String(), "topic", rt.policy.topic, "err", err)
				rec = cutDeadLetter(rec, cuts, err)
				i = 0
				continue
			}
			// Even the origin and failure headers alone are refused:
			// only the topic's configuration can change that. Loud, and
			// on the status page as the record's last error.
			t.fail.Store(&failure{attempts: a.n, err: "dead-letter write refused even cut to its headers: " + err.Error(), kind: kind})
			r.log.Error("dead letter refused even without the record's key, value and headers; retrying, the record holds its partition until the dead-letter topic takes it (see its max.message.bytes)", "record", t.rec.String(), "topic", rt.policy.topic, "err", err)
		} else {
			r.log.Warn("dead-letter write failed; retrying, the record holds its partition", "record", t.rec.String(), "err", err)
		}
		if !r.sleep(ctx, rt, i) {
			return false
		}
	}
}

// writeDeadLetter calls the route's DeadLetterWriter once; a panic in it
// is recovered into a *PanicError, a failed write (retried like any other).
func (r *Runner) writeDeadLetter(ctx context.Context, rt *route, rec Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			pe := &PanicError{Record: rec.String(), In: "DeadLetterWriter", Value: v, Stack: debug.Stack()}
			r.log.Error("DeadLetterWriter panicked", "record", pe.Record, "panic", fmt.Sprint(v), "stack", string(pe.Stack))
			err = pe
		}
	}()
	return rt.dlw.WriteDeadLetter(ctx, rt.policy.topic, rec)
}
