package runner_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// assigned returns a runner, not running, that owns n partitions.
func assigned(t *testing.T, n int) *runner.Runner {
	t.Helper()
	r := newRunner(t, newDriver(), runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }))
	tps := make([]runner.TP, n)
	for i := range tps {
		tps[i] = tp(int32(i))
	}
	runner.AssignForTest(r, tps)
	return r
}

// TestBudgetCostIsFlat: the budget the runner returns with every Fetched
// costs the same with 20,000 partitions as with 10. (budget() scanned every
// owned partition: O(P) per hand-over, O(P²) per kafkago fetch round.)
func TestBudgetCostIsFlat(t *testing.T) {
	// The best of five rounds: a round the scheduler stopped (a loaded
	// machine) says nothing of the cost; a scan of 20,000 partitions
	// slows every round.
	per := func(n int) time.Duration {
		r := assigned(t, n)
		const calls = 500
		best := time.Duration(-1)
		for range 5 {
			start := time.Now()
			for range calls {
				if b := runner.BudgetForTest(r); b < 1 {
					t.Fatalf("budget %d", b)
				}
			}
			if d := time.Since(start) / calls; best < 0 || d < best {
				best = d
			}
		}
		return best
	}
	per(10) // warm up
	few, many := per(10), per(20_000)
	if many > 20*few+time.Microsecond {
		t.Fatalf("the budget costs %v with 20,000 partitions and %v with 10: it grows with the partitions", many, few)
	}
}

// TestPublishStatsReusesItsBuffers: the periodic stats snapshot allocates
// nothing once its buffers have grown. (It allocated O(P) every tick.)
func TestPublishStatsReusesItsBuffers(t *testing.T) {
	r := assigned(t, 1000)
	runner.PublishStatsForTest(r)
	runner.PublishStatsForTest(r)
	if n := testing.AllocsPerRun(20, func() { runner.PublishStatsForTest(r) }); n != 0 {
		t.Fatalf("a stats snapshot of 1,000 partitions allocates %v times, want 0", n)
	}
}

// TestBudgetNeverExceedsTheLeastRoom checks the banded budget against the
// scan it replaced, over random hand-overs and completions with some
// records stuck (so windows fill): never above the least room of an
// unpaused partition (so no poll passes a high water mark or a window),
// never below pollChunk, and within 1/32 of the water marks' gap below the
// exact value.
func TestBudgetNeverExceedsTheLeastRoom(t *testing.T) {
	t.Parallel()
	for _, marks := range [][2]int{{300, 60}, {100, 99}, {3, 0}, {10, 8}, {2000, 0}} {
		high, low := marks[0], marks[1]
		d := newDriver()
		r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
			runner.WaterMarks(high, low), runner.MaxBufferedBytes(1<<40), runner.ByteWaterMarks(1<<40, 1<<39))
		const parts = 40
		tps := make([]runner.TP, parts)
		for i := range tps {
			tps[i] = tp(int32(i))
		}
		runner.AssignForTest(r, tps)
		rng := rand.New(rand.NewPCG(uint64(high), uint64(low)))
		next := make([]int64, parts)
		delivered := 0
		for step := range 500 {
			b, exact, pc := runner.BudgetForTest(r), runner.ExactBudgetForTest(r), runner.PollChunkForTest(r)
			if b > exact || b < min(pc, exact) || exact-b > (high-low)/32+1 {
				t.Fatalf("marks %d/%d, step %d: budget %d, exact %d, pollChunk %d", high, low, step, b, exact, pc)
			}
			p := rng.IntN(parts)
			for i := 0; d.isPaused(tp(int32(p))) && i < parts; i++ {
				p = (p + 1) % parts
			}
			if !d.isPaused(tp(int32(p))) {
				n := 1 + rng.IntN(b)
				runner.DeliverForTest(r, batch(records(int32(p), next[p], n, 1+rng.IntN(50))))
				next[p] += int64(n)
				delivered++
			}
			// A few records wait a while: the windows fill behind them.
			runner.CompleteForTest(r, rng.IntN(2*high), func(rec runner.Record) bool { return rec.Offset%97 == 7 && rng.IntN(20) != 0 })
		}
		if delivered < 250 {
			t.Fatalf("marks %d/%d: hand-overs in only %d of 500 steps: the partitions stalled, little was tested", high, low, delivered)
		}
	}
}
