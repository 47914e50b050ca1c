package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// lookupError is an error type whose Error reads its fields, as most do.
type lookupError struct{ id string }

func (e *lookupError) Error() string { return "lookup " + e.id + " failed" }

// TestTypedNilErrorIsAFailedAttempt: the classic Go mistake, a handler
// that returns a nil *lookupError as its error (non-nil as an interface),
// whose Error method panics. It is one poison record, a failed attempt
// like a panic in the handler, not a crash of the process: under
// Skip(1) it is skipped and the runner goes on.
func TestTypedNilErrorIsAFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0}, runner.Record{Topic: topic, Partition: 0, Offset: 1})
		r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			if rec.Offset == 0 {
				var e *lookupError // nil
				return e
			}
			return nil
		}), runner.Failure(runner.Skip(1)), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "both records finished", committedAt(src, 0, 2))
	})
}

// TestTypedNilErrorInABatch is TestTypedNilErrorIsAFailedAttempt for a
// batch handler.
func TestTypedNilErrorInABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		dl := &letters{}
		r := newRunner(t, src, runner.HandleBatch(topic, func(context.Context, []runner.Record) error {
			var e *lookupError
			return errors.Join(e)
		}), runner.Failure(runner.DeadLetter("t.dlt", 1, dl)), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "dead-lettered", committedAt(src, 0, 1))
	})
}
