//go:build integration

package integration_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// TestOperatorPauseSurvivesRebalance: member a pauses partition 0 for an
// operator. Member b joins and leaves the group (eager rebalances: every
// partition is revoked each time), so a's partition 0 is revoked and
// assigned back. It stays paused on a: a handles none of its records,
// before or after, while partition 1 flows; the operator's resume lets it
// through. (b, another process, consumes partition 0 while it has it: the
// pause is a's alone, as documented.)
func TestOperatorPauseSurvivesRebalance(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	topic := bed.Topic(t, 2)
	group := bed.Group(t)
	tp0 := runner.TP{Topic: topic, Partition: 0}
	var aHandled [2]atomic.Int64
	a := runMember(t, "a", franzSource(t, group, topic, franz.Eager()), topic, func(_ context.Context, rec runner.Record) error {
		aHandled[rec.Partition].Add(1)
		return nil
	})
	ctx := context.Background()
	if err := a.Runner.PausePartitions(ctx, tp0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a owns both partitions", func() bool { return len(a.Runner.Stats().Partitions) == 2 })

	cl := bed.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceTo := func(p int32, n int) {
		t.Helper()
		for range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produceTo(0, 10)
	produceTo(1, 10)
	waitFor(t, time.Minute, "a handles partition 1", func() bool { return aHandled[1].Load() == 10 })

	var bHandled atomic.Int64
	b := runMember(t, "b", franzSource(t, group, topic, franz.Eager()), topic, func(context.Context, runner.Record) error {
		bHandled.Add(1)
		return nil
	})
	waitFor(t, time.Minute, "b joins with a partition", func() bool { return len(b.Runner.Stats().Partitions) == 1 })
	b.Stop(t)
	waitFor(t, time.Minute, "a owns both partitions again", func() bool { return len(a.Runner.Stats().Partitions) == 2 })

	// a's partition 0 was revoked and assigned back. The history records
	// an assignment once Sink.Assigned returned (with the time it took),
	// which can be just after Stats shows its partitions: wait for it.
	reassigned := func() bool {
		var revoked bool
		for _, rb := range a.Runner.Stats().Member.Rebalances {
			switch {
			case rb.Kind == "revoked" && slices.Contains(rb.Partitions, tp0):
				revoked = true
			case revoked && rb.Kind == "assigned" && slices.Contains(rb.Partitions, tp0):
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(10 * time.Second)
	for !reassigned() {
		if time.Now().After(deadline) {
			t.Fatalf("a's partition 0 was not revoked and assigned back: rebalances %+v", a.Runner.Stats().Member.Rebalances)
		}
		time.Sleep(20 * time.Millisecond)
	}

	before := aHandled[1].Load()
	produceTo(0, 10)
	produceTo(1, 10)
	waitFor(t, time.Minute, "a handles partition 1's new records", func() bool { return aHandled[1].Load() >= before+10 })
	// Several commit intervals and fetches more: partition 0 must stay put.
	time.Sleep(2 * time.Second)
	if n := aHandled[0].Load(); n != 0 {
		t.Fatalf("a handled %d records of partition 0 it paused for the operator", n)
	}
	st := partitionStats(a.Runner, tp0)
	if !st.Paused || st.PausedBy&runner.PausedOperator == 0 {
		t.Fatalf("a's partition 0 after the rebalance: paused %v by %q, want paused by the operator", st.Paused, st.PausedBy)
	}
	if got := a.Runner.OperatorPaused(); !slices.Equal(got.Partitions, []runner.TP{tp0}) {
		t.Fatalf("OperatorPaused = %+v, want partition 0", got)
	}

	if err := a.Runner.ResumePartitions(ctx, tp0); err != nil {
		t.Fatal(err)
	}
	// a consumes partition 0 from its committed offset: what b did not
	// commit, and the 10 records produced since.
	end := bed.EndOffsets(t, topic)
	waitCommitted(t, group, topic, end, time.Minute)
	if aHandled[0].Load() < 10 {
		t.Fatalf("a handled %d records of partition 0 after the resume, want at least the 10 produced since b left", aHandled[0].Load())
	}
}

// waitFor polls cond every 50ms until it holds, or fails the test after
// within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not so within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// partitionStats returns r's stats of tp (the zero value when not owned).
func partitionStats(r *runner.Runner, tp runner.TP) runner.PartitionStats {
	for _, p := range r.Stats().Partitions {
		if p.TP == tp {
			return p
		}
	}
	return runner.PartitionStats{}
}
