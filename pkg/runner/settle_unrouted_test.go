package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestSettledUnroutedIsNotBlocked: over a share group every record must
// end (Block holds its lock forever, which New refuses). With each
// registered topic under a policy of its own and the runner-wide one left
// at Block, a record of a topic nobody registered (the share source
// subscribes to more topics than the runner handles) runs under the
// runner-wide policy: New must refuse that Block too, or the record must
// be settled.
func TestSettledUnroutedIsNotBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		other := runner.TP{Topic: "other", Partition: 0}
		src := newSettleSource(runner.Batch{TP: other, Records: []runner.Record{{Topic: "other", Partition: 0, Offset: 0}}})
		r, err := runner.New(src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil },
			runner.WithPolicy(runner.Skip(1))), runner.Logger(discard()))
		if err != nil {
			var ce *runner.ConfigError
			if !errors.As(err, &ce) || ce.Option != "Failure" {
				t.Fatalf("New returned %v, want nil or a *ConfigError for Failure", err)
			}
			return
		}
		started(t, r)
		await(t, time.Minute, "the record of the unregistered topic settled", func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			return len(src.settled[0]) > 0
		})
	})
}
