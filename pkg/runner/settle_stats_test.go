package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestSettledStatsShowTheOldestRecord: in settled mode there is no tracker,
// but Stats and tidemark.record.oldest_age still show a partition's oldest
// unfinished record — the one delivered first of those not finished — its
// age and its state, so a stuck handler over a share source is seen.
func TestSettledStatsShowTheOldestRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newSettleSource(runner.Batch{TP: tp(0), Records: recs(8, 3, 5), Position: -1, HighWatermark: -1})
		release := make(chan struct{})
		m := newMeter()
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 8 {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}), runner.Failure(runner.Skip(1)), runner.MeterProvider(m.provider))
		started(t, r)
		await(t, 3*time.Second, "offsets 3 and 5 settled", func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			return len(src.settled[3]) == 1 && len(src.settled[5]) == 1
		})
		st := r.Stats()
		if len(st.Partitions) != 1 {
			t.Fatalf("Stats has %d partitions, want 1", len(st.Partitions))
		}
		p := st.Partitions[0]
		if p.OldestOffset != 8 || p.OldestState != runner.Running || p.OldestAge < 2*time.Second {
			t.Errorf("oldest unfinished: offset %d, %v, age %v; want offset 8, running, at least 2s old", p.OldestOffset, p.OldestState, p.OldestAge)
		}
		if s := m.attr(t, "tidemark.record.oldest_age", "tidemark.record.state"); s != "running" {
			t.Errorf("tidemark.record.oldest_age's state %q, want running", s)
		}
		close(release)
		await(t, 3*time.Second, "offset 8 settled and the stats refreshed", func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			return len(src.settled[8]) == 1
		})
		if p := r.Stats().Partitions[0]; p.OldestOffset != -1 || p.OldestState != runner.NoRecord {
			t.Errorf("with nothing unfinished: oldest offset %d, %v; want -1, none", p.OldestOffset, p.OldestState)
		}
	})
}
