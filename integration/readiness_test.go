//go:build integration

package integration_test

// Readiness against the real broker: what the runner reports of its
// membership (Stats.Member) and what shutdown.Probes makes of it.

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// runPlain runs a runner over src (no spy: the spy would hide the source's
// Membership) with a no-op handler for topic, shut down in the test's
// cleanup within 20s.
func runPlain(t *testing.T, src runner.Source, topic string, opts ...runner.Option) *runner.Runner {
	t.Helper()
	r, err := runner.New(src, append([]runner.Option{runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(100 * time.Millisecond), runner.DrainBudget(5 * time.Second)}, opts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// TestIdleMemberJoined: in a group with more members than partitions, the
// member that gets nothing is still reported joined (Stats.Member.Joined),
// under the classic protocol (cooperative and eager) and KIP-848, whose
// broker never calls OnPartitionsAssigned for an empty assignment.
func TestIdleMemberJoined(t *testing.T) {
	cases := []struct {
		name string
		opts []franz.Option
	}{
		{"cooperative", nil},
		{"eager", []franz.Option{franz.Eager()}},
		{"kip848", []franz.Option{franz.ServerSideAssignment()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			topic, group := bed.Topic(t, 1), bed.Group(t)
			a := runPlain(t, franzSource(t, group, topic, tc.opts...), topic)
			kafkatest.WaitFor(t, 30*time.Second, "the first member owns the partition", func() bool { return len(a.Stats().Partitions) == 1 })
			b := runPlain(t, franzSource(t, group, topic, tc.opts...), topic)
			kafkatest.WaitFor(t, 30*time.Second, "the second member has a member id", func() bool { return b.Stats().Member.MemberID != "" })
			kafkatest.WaitFor(t, 30*time.Second, "both members joined, one of them owning the partition", func() bool {
				sa, sb := a.Stats(), b.Stats()
				return sa.Member.Joined && sb.Member.Joined && len(sa.Partitions)+len(sb.Partitions) == 1
			})
			idle := b
			if len(b.Stats().Partitions) == 1 {
				idle = a
			}
			m := idle.Stats().Member
			if m.Group != group || m.MemberID == "" || m.Generation < 0 || m.ContactAt.IsZero() || len(m.Rebalances) == 0 {
				t.Fatalf("the idle member's Stats.Member = %+v, want group %s, a member id, a generation, a contact and its rebalances", m, group)
			}
		})
	}
}
