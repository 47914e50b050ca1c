package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
// inside the runner, with the same *TimeoutError; Timeout can bound part
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
			return cause.run(ctx, rec.String, func(ctx context.Context) error { return next(ctx, rec) })
		}
	}
}

// run calls f under the cause's deadline and returns its error as a
// *TimeoutError naming what() when the deadline ended the attempt.
func (c *timeoutCause) run(ctx context.Context, what func() string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeoutCause(ctx, c.d, c)
	defer cancel()
	err := f(ctx)
	if err != nil && context.Cause(ctx) == error(c) {
		return &TimeoutError{Record: what(), Timeout: c.d, Err: err}
	}
	return err
}

// timeoutCause is the cancellation cause of one Timeout middleware's
// deadlines.
type timeoutCause struct{ d time.Duration }

func (c *timeoutCause) Error() string { return "runner: Timeout(" + c.d.String() + ") expired" }

// TimeoutError is a handler attempt that failed after the deadline of a
// Timeout middleware, WithTimeout or HandlerTimeout passed. errors.As finds it; it unwraps to the
// handler's error, so errors.Is(err, context.DeadlineExceeded) holds when
// the handler returned its ctx's error.
type TimeoutError struct {
	Record  string        // topic/partition@offset
	Timeout time.Duration // the timeout that passed
	Err     error         // what the handler returned
}

func (e *TimeoutError) Error() string {
	msg := "runner: handler for " + e.Record + " timed out after " + e.Timeout.String()
	if e.Err == nil {
		return msg
	}
	return msg + ": " + e.Err.Error()
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// LogFailures returns a Middleware that logs each failed attempt of the
// handler it wraps at warn level, with the record (topic/partition@offset,
// as the runner's own log lines), the attempt number (Attempt), the error's
// kind by the default classification (KindOf; a Classifier given to the
// runner may decide otherwise) and the error. It logs neither the record's
// key nor its value, which can be secret. A nil logger is slog.Default()
// as it is when LogFailures is called.
//
// An error returned once the runner cancelled ctx (the partition was lost
// or revoked past its drain budget, or the runner is closing) is logged at
// debug level only: the runner does not count it as a failed attempt, and
// the record runs again at its next owner. An error wrapping ErrFenced is
// logged at warn as a fence, without a kind: the runner neither retries
// nor completes the record (see ErrFenced). A panic is not recovered: it
// goes on to the runner, which recovers and logs it with its stack.
//
// The runner logs every failed attempt too, through its Logger and
// without the attempt's ctx. LogFailures is a topic's own log: its logger,
// each line logged with the attempt's ctx (which a slog.Handler can take
// the trace from), and the error as it is at LogFailures' place in the
// chain. Put it outside Timeout, so that it logs the *TimeoutError:
// Chain(h, LogFailures(logger), Timeout(d)).
func LogFailures(logger *slog.Logger) Middleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, rec Record) error {
			err := next(ctx, rec)
			if err != nil {
				logFailure(ctx, logger, err, slog.String("record", rec.String()))
			}
			return err
		}
	}
}

// logFailure logs one failed attempt as LogFailures and LogBatchFailures
// say, with what names the attempt's record or batch.
func logFailure(ctx context.Context, logger *slog.Logger, err error, what ...slog.Attr) {
	attrs := append(what, slog.Int("attempt", Attempt(ctx)))
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		logger.LogAttrs(ctx, slog.LevelDebug, "handler attempt ended by a cancelled context", append(attrs, slog.Any("err", err))...)
	case errors.Is(err, ErrFenced):
		logger.LogAttrs(ctx, slog.LevelWarn, "handler attempt fenced by a newer owner", append(attrs, slog.Any("err", err))...)
	default:
		logger.LogAttrs(ctx, slog.LevelWarn, "handler attempt failed",
			append(attrs, slog.String("kind", KindOf(err).String()), slog.Any("err", err))...)
	}
}

// BatchMiddleware wraps a BatchHandler, as Middleware wraps a Handler.
type BatchMiddleware func(BatchHandler) BatchHandler

// ChainBatch returns h wrapped by mw, the first middleware outermost:
// ChainBatch(h, a, b) runs a(b(h)).
func ChainBatch(h BatchHandler, mw ...BatchMiddleware) BatchHandler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// BatchTimeout is Timeout for a BatchHandler: each attempt of a batch gets
// a deadline d after it starts, and one that fails after it passed is
// returned as a *TimeoutError whose Record names the batch
// (topic/partition@first-last), wrapping the handler's error (a
// *BatchError in it keeps its meaning). d == 0 is no timeout; a negative
// d panics.
func BatchTimeout(d time.Duration) BatchMiddleware {
	if d < 0 {
		panic(fmt.Sprintf("runner: BatchTimeout(%v): the timeout is negative", d))
	}
	return func(next BatchHandler) BatchHandler {
		if d == 0 {
			return next
		}
		cause := &timeoutCause{d: d}
		return func(ctx context.Context, recs []Record) error {
			return cause.run(ctx, func() string { return batchName(recs) }, func(ctx context.Context) error { return next(ctx, recs) })
		}
	}
}

// LogBatchFailures is LogFailures for a BatchHandler: each failed attempt
// of a batch is logged with the batch (topic/partition@first-last), its
// size, the record a *BatchError names (failed_record), the attempt, the
// kind and the error; never a key or a value.
func LogBatchFailures(logger *slog.Logger) BatchMiddleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next BatchHandler) BatchHandler {
		return func(ctx context.Context, recs []Record) error {
			err := next(ctx, recs)
			if err == nil {
				return nil
			}
			what := []slog.Attr{slog.String("batch", batchName(recs)), slog.Int("records", len(recs))}
			var be *BatchError
			if errors.As(err, &be) && be.Index >= 0 && be.Index < len(recs) {
				what = append(what, slog.String("failed_record", recs[be.Index].String()))
			}
			logFailure(ctx, logger, err, what...)
			return err
		}
	}
}

// batchName names a batch of one partition: topic/partition@first-last,
// or topic/partition@offset for one record.
func batchName(recs []Record) string {
	switch len(recs) {
	case 0:
		return "an empty batch"
	case 1:
		return recs[0].String()
	}
	return recs[0].String() + "-" + strconv.FormatInt(recs[len(recs)-1].Offset, 10)
}
