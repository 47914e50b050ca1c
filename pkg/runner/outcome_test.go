package runner_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestOutcomeUnknownIsNeverGivenUp: a record whose attempts end with an
// error wrapping runner.ErrOutcomeUnknown (the attempt may have taken
// effect) is retried past the policy's attempts, under Skip and under
// DeadLetter alike: it is neither skipped nor dead-lettered, and it
// completes when an attempt succeeds.
func TestOutcomeUnknownIsNeverGivenUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy func(d *dlq) runner.Policy
	}{
		{"skip", func(*dlq) runner.Policy { return runner.Skip(2) }},
		{"dead letter", func(d *dlq) runner.Policy { return runner.DeadLetter("t.dlq", 2, d) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := runnertest.New()
				fill(src, 1, 5, 5)
				d := &dlq{allow: make(chan struct{})}
				close(d.allow)
				m := newMeter()
				var attempts atomic.Int32
				r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
					if rec.Offset == 2 && attempts.Add(1) <= 6 {
						return fmt.Errorf("commit of %s: %w", rec.String(), runner.ErrOutcomeUnknown)
					}
					return nil
				}), runner.Failure(tc.policy(d)), runner.Backoff(time.Millisecond, time.Millisecond),
					runner.CommitInterval(2*time.Millisecond), runner.MeterProvider(m.provider))
				started(t, r)
				assign(t, src, tp(0))
				await(t, time.Second, "commit at the end", committedAt(src, 0, 5))
				if n := attempts.Load(); n != 7 {
					t.Fatalf("offset 2 ran %d times, want 7 (6 unknown outcomes, then success)", n)
				}
				if n := m.sum(t, "tidemark.records.skipped") + m.sum(t, "tidemark.records.dead_lettered"); n != 0 {
					t.Fatalf("%d records skipped or dead-lettered, want 0", n)
				}
				d.mu.Lock()
				defer d.mu.Unlock()
				if len(d.got) != 0 {
					t.Fatalf("%d dead-letter writes, want 0", len(d.got))
				}
			})
		})
	}
}
