package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestDeadLetterPartialOrigin: a record that carries a
// tidemark-origin-topic header but not the partition and offset (a
// producer of its own, or a redrive that dropped headers) is not a
// redriven dead letter with an origin to keep: its dead letter must carry
// a whole origin — topic, partition and offset — or neither `tidemark dlt
// replay` nor the inbox can recognise it.
func TestDeadLetterPartialOrigin(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 3, Offset: 42,
			Headers: []runner.Header{{Key: runner.HeaderOriginTopic, Value: []byte("elsewhere")}}})
		dl := &letters{}
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
			return runner.Permanent(errPoison)
		}), runner.Failure(runner.DeadLetter("t.dlt", 1, dl)), runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, runner.TP{Topic: topic, Partition: 3})
		await(t, time.Minute, "dead-lettered", func() bool { _, recs := dl.got(); return len(recs) == 1 })
		_, recs := dl.got()
		for _, h := range []string{runner.HeaderOriginTopic, runner.HeaderOriginPartition, runner.HeaderOriginOffset} {
			if _, ok := recs[0].Header(h); !ok {
				t.Errorf("the dead letter has no %s: %v", h, recs[0].Headers)
			}
		}
	})
}
