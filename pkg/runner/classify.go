package runner

import (
	"context"
	"errors"
)

// ErrorKind says how the failure policy counts a failed attempt. A
// Classifier decides it for each error; without one, Permanent and
// Transient marks decide, and every other error is Retryable.
type ErrorKind uint8

const (
	// Retryable errors are retried with backoff and counted against the
	// policy's attempts: after the last one the policy dead-letters or
	// skips the record (Block retries forever). The default.
	Retryable ErrorKind = iota
	// TransientKind errors are retried with backoff and not counted: the
	// record waits, holding its key (or partition), until an attempt
	// succeeds or fails otherwise. A database or service outage is
	// transient; dead-lettering good records because it lasted five
	// attempts would lose their effects. Transient marks an error so.
	TransientKind
	// PermanentKind errors go straight to the policy's end: dead-lettered
	// or skipped at once, with no retry (under Block, retried as every
	// error is: Block never gives a record up). A record that cannot be
	// decoded, or that a handler rejects as invalid, will fail the same
	// way every time. Permanent marks an error so.
	PermanentKind
)

func (k ErrorKind) String() string {
	switch k {
	case Retryable:
		return "retryable"
	case TransientKind:
		return "transient"
	case PermanentKind:
		return "permanent"
	}
	return "ErrorKind(?)"
}

// Classifier tells the kind of a handler's error. It is called for every
// failed attempt, with the error the handler returned (a *PanicError for a
// panic), from the worker that ran it: it must be safe for concurrent use
// and quick. Set one with Classify (runner-wide) or WithClassifier (one
// topic); it replaces the default, which honours the Permanent and
// Transient marks: a Classifier that wants them too calls KindOf. A kind
// other than the three below (or a panic) counts as Retryable.
type Classifier func(err error) ErrorKind

// PermanentError marks an error that retrying cannot fix. Create one with
// Permanent; errors.As finds it through any wrapping.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent"
	}
	return "permanent: " + e.Err.Error()
}
func (e *PermanentError) Unwrap() error { return e.Err }

// TransientError marks an error that waiting will fix. Create one with
// Transient; errors.As finds it through any wrapping.
type TransientError struct{ Err error }

func (e *TransientError) Error() string {
	if e.Err == nil {
		return "transient"
	}
	return "transient: " + e.Err.Error()
}
func (e *TransientError) Unwrap() error { return e.Err }

// Permanent marks err as permanent (see PermanentKind): the failure policy
// dead-letters or skips the record without retrying it. Permanent(nil) is
// nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Transient marks err as transient (see TransientKind): the failure policy
// retries the record with backoff without counting the attempt.
// Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &TransientError{Err: err}
}

// KindOf is the default classification: PermanentKind when err wraps a
// *PermanentError, TransientKind when it wraps a *TransientError (the
// outermost mark wins when both are there), Retryable otherwise. It finds
// the marks errors.As finds: through Unwrap, both forms, and through an
// error's As method.
func KindOf(err error) ErrorKind {
	for err != nil {
		switch e := err.(type) {
		case *PermanentError:
			return PermanentKind
		case *TransientError:
			return TransientKind
		case interface{ As(any) bool }:
			var pe *PermanentError
			if e.As(&pe) {
				return PermanentKind
			}
			var te *TransientError
			if e.As(&te) {
				return TransientKind
			}
		}
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if k := KindOf(inner); k != Retryable {
					return k
				}
			}
			return Retryable
		}
		err = errors.Unwrap(err)
	}
	return Retryable
}

// attemptKey is the context key of the attempt number.
type attemptKey struct{}

// attemptCtx carries the attempt number of the record a handler runs.
// Once a handler got one it is never changed: a handler may hand its ctx
// to a goroutine or a callback that outlives the call, as any context.
type attemptCtx struct {
	context.Context
	attempt int
}

// attemptContext returns ctx carrying attempt. The first attempt of a
// record whose ctx is its partition's own (tracing off, nothing
// propagated) gets the partition's prebuilt one and costs no allocation;
// a retry, or a ctx of its own, gets a new one.
func attemptContext(ctx context.Context, ps *partState, attempt int) context.Context {
	if attempt == 1 && ctx == ps.ctx {
		return &ps.first
	}
	return &attemptCtx{Context: ctx, attempt: attempt}
}

func (c *attemptCtx) Value(key any) any {
	if key == (attemptKey{}) {
		return c.attempt
	}
	return c.Context.Value(key)
}

// Attempt returns the attempt number of the record whose handler got ctx
// (or a context derived from it): 1 on the first attempt, 2 on the first
// retry, and so on, counting every attempt whatever its error's kind. It is
// 0 for a context that did not come from the runner. A record replayed
// after a restart or a rebalance starts at 1 again: the count is this
// process's, not the broker's (Record.DeliveryCount is the broker's, for a
// share group).
func Attempt(ctx context.Context) int {
	if n, ok := ctx.Value(attemptKey{}).(int); ok {
		return n
	}
	return 0
}
