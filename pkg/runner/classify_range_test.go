package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestClassifierOutOfRangeKind: a Classifier that returns a kind the runner
// does not know (a bug, or a kind from a newer version) must not keep a
// record forever under DeadLetter: it counts as the default, Retryable,
// and the record is dead-lettered after the policy's attempts.
func TestClassifierOutOfRangeKind(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		dl := &letters{}
		var calls atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			calls.Add(1)
			return errPoison
		}), runner.Classify(func(error) runner.ErrorKind { return runner.ErrorKind(7) }),
			runner.Failure(runner.DeadLetter("t.dlt", 3, dl)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Minute, "record dead-lettered", func() bool { _, recs := dl.got(); return len(recs) == 1 })
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d attempts, want 3", n)
		}
	})
}
