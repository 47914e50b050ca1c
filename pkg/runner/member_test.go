package runner_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// memberSource is a runnertest.Source that is Grouped and reports a fixed
// Membership.
type memberSource struct {
	*runnertest.Source
	info runner.MemberInfo
}

func (m *memberSource) Group() string                 { return "g1" }
func (m *memberSource) Membership() runner.MemberInfo { return m.info }

func kinds(rs []runner.Rebalance) []string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, r.Kind)
	}
	return ks
}

// TestMemberJoinedFollowsReports checks Stats.Member.Joined and the
// rebalance history: not joined before any report, joined after an empty
// assignment (a member of a group with more members than partitions),
// still joined after a revoke, not joined after a loss, even an empty one,
// and joined again after the next assignment.
func TestMemberJoinedFollowsReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 10, 10)
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }))
		started(t, r)
		ctx := context.Background()
		m := r.Stats().Member
		if m.Joined || len(m.Rebalances) != 0 || m.Generation != runner.NoGeneration || m.Group != "" || m.MemberID != "" {
			t.Fatalf("before any report: %+v, want not joined, no history, generation -1, no group", m)
		}
		step := func(what string, f func() error, joined bool, kind string, parts []runner.TP, gen int32) {
			t.Helper()
			if err := f(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			m := r.Stats().Member
			if m.Joined != joined {
				t.Fatalf("after %s: Joined = %v, want %v", what, m.Joined, joined)
			}
			last := m.Rebalances[len(m.Rebalances)-1]
			if last.Kind != kind || !slices.Equal(last.Partitions, parts) || last.Generation != gen {
				t.Fatalf("after %s: last rebalance %+v, want kind %s, partitions %v, generation %d", what, last, kind, parts, gen)
			}
		}
		// An empty report carries no generation.
		step("an empty assignment", func() error { return src.Assign(ctx) }, true, "assigned", nil, runner.NoGeneration)
		step("an assignment", func() error { return src.Assign(ctx, tp(0), tp(1)) }, true, "assigned", []runner.TP{tp(0), tp(1)}, 2)
		step("a revoke", func() error { return src.Revoke(ctx, tp(1)) }, true, "revoked", []runner.TP{tp(1)}, 2)
		step("a loss", func() error { return src.Lose(ctx, tp(0)) }, false, "lost", []runner.TP{tp(0)}, 2)
		step("an assignment", func() error { return src.Assign(ctx, tp(0)) }, true, "assigned", []runner.TP{tp(0)}, 3)
		step("an empty loss", func() error { return src.Lose(ctx) }, false, "lost", nil, runner.NoGeneration)
		step("a revoke of a partition not held", func() error { return src.Revoke(ctx, tp(1)) }, false, "revoked", []runner.TP{tp(1)}, runner.NoGeneration)
		if got, want := kinds(r.Stats().Member.Rebalances), []string{"assigned", "assigned", "revoked", "lost", "assigned", "lost", "revoked"}; !slices.Equal(got, want) {
			t.Fatalf("history %v, want %v", got, want)
		}
	})
}

// TestMemberHistoryKeepsTheLatest checks that the history keeps the most
// recent MaxRebalances reports, oldest first.
func TestMemberHistoryKeepsTheLatest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }))
		started(t, r)
		ctx := context.Background()
		const n = runner.MaxRebalances + 9
		for i := range n {
			if err := src.AssignGeneration(ctx, int32(i), tp(int32(i))); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // fake time: the reports' At differ
		}
		h := r.Stats().Member.Rebalances
		if len(h) != runner.MaxRebalances {
			t.Fatalf("%d reports kept, want %d", len(h), runner.MaxRebalances)
		}
		for i, rb := range h {
			if want := int32(n - runner.MaxRebalances + i); rb.Generation != want {
				t.Fatalf("report %d has generation %d, want %d (oldest first, the latest kept)", i, rb.Generation, want)
			}
			if i > 0 && !rb.At.After(h[i-1].At) {
				t.Fatalf("report %d at %v, not after report %d at %v", i, rb.At, i-1, h[i-1].At)
			}
		}
	})
}

// TestMemberRevokeTook checks that a revoke's Took covers the drain: the
// handler holds it for 7s of the bubble's clock.
func TestMemberRevokeTook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 1, 1)
		entered, release := make(chan struct{}), make(chan struct{})
		h := func(context.Context, runner.Record) error {
			close(entered)
			<-release
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.DrainBudget(time.Minute))
		started(t, r)
		ctx := context.Background()
		assign(t, src, tp(0))
		<-entered
		go func() {
			time.Sleep(7 * time.Second)
			close(release)
		}()
		if err := src.Revoke(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		h0 := r.Stats().Member.Rebalances
		rb := h0[len(h0)-1]
		if rb.Kind != "revoked" || rb.Took < 7*time.Second || rb.Took > 8*time.Second {
			t.Fatalf("revoke recorded as %+v, want kind revoked and Took in [7s, 8s]", rb)
		}
	})
}

// TestMemberInfoFromSource checks that Stats.Member carries the source's
// Membership and its Group.
func TestMemberInfoFromSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		at := time.Now()
		info := runner.MemberInfo{MemberID: "m-1", InstanceID: "pod-0", Generation: 12, ContactAt: at, ContactErr: "dial tcp: refused"}
		src := &memberSource{Source: runnertest.New(), info: info}
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }))
		m := r.Stats().Member
		if m.Group != "g1" || m.MemberInfo != info || m.Joined {
			t.Fatalf("Stats.Member = %+v, want group g1, the source's %+v, not joined", m, info)
		}
	})
}
