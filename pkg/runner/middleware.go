package runner

import (
	"context"
	"fmt"
	"time"
)

// Timeout returns a Middleware that gives each attempt of the handler it
// wraps a deadline d after the attempt starts: on one topic's handler, it
// is that topic's handler timeout. An attempt that fails after that
// deadline passed is returned as a *TimeoutError wrapping the handler's
// error (context.DeadlineExceeded, when the handler returns ctx.Err()),
// which the failure policy counts as an ordinary failed attempt, retried
// with backoff; marks the handler put on its error (Permanent, Transient)
// are kept. An attempt that succeeds, or fails before the deadline, is
// returned as it is, as is a failure after the runner cancelled ctx (the
// partition was lost) or after an earlier deadline of ctx's own passed.
//
// WithTimeout (per topic) and HandlerTimeout set such a deadline from
// inside the runner, and the handler's error comes back as it is;
// Timeout's error says the attempt timed out, and Timeout can bound part
// of a chain. Where both are set, the shorter ends the attempt.
//
// A handler that ignores its ctx is not stopped: the runner waits for it,
// as it does without Timeout. d == 0 is no timeout (the handler is
// returned unwrapped), as for WithTimeout; Timeout panics on a negative
// d, a programming error found when the handlers are wired.
func Timeout(d time.Duration) Middleware {
	if d < 0 {
		panic(fmt.Sprintf("runner: Timeout(%v): the timeout is negative", d))
	}
	return func(next Handler) Handler {
		if d == 0 {
			return next
		}
		// A cause of this middleware's own tells its deadline from any
		// other end of ctx: context.Cause reports it only when this
		// deadline was what ended the attempt's context.
		cause := &timeoutCause{d: d}
		return func(ctx context.Context, rec Record) error {
			ctx, cancel := context.WithTimeoutCause(ctx, d, cause)
			defer cancel()
			err := next(ctx, rec)
			if err != nil && context.Cause(ctx) == error(cause) {
				return &TimeoutError{Record: rec.String(), Timeout: d, Err: err}
			}
			return err
		}
	}
}

// timeoutCause is the cancellation cause of one Timeout middleware's
// deadlines.
type timeoutCause struct{ d time.Duration }

func (c *timeoutCause) Error() string { return "runner: Timeout(" + c.d.String() + ") expired" }

// TimeoutError is a handler attempt that failed after the deadline of a
// Timeout middleware passed. errors.As finds it; it unwraps to the
// handler's error, so errors.Is(err, context.DeadlineExceeded) holds when
// the handler returned its ctx's error.
type TimeoutError struct {
	Record  string        // topic/partition@offset
	Timeout time.Duration // the Timeout middleware's d
	Err     error         // what the handler returned
}

func (e *TimeoutError) Error() string {
	return "runner: handler for " + e.Record + " timed out after " + e.Timeout.String() + ": " + e.Err.Error()
}

func (e *TimeoutError) Unwrap() error { return e.Err }
