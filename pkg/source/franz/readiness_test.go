package franz_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestReadinessNotCoordinator: the coordinator answers every group request
// NOT_COORDINATOR while FindCoordinator keeps naming it (a coordinator
// that moved away, or a stale one). franz-go counts the answers (its hooks
// do not carry the error code) but its group session ends and it hears
// the loss: readiness fails within the contact limit.
func TestReadinessNotCoordinator(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"))
	m := startMember(t, c, "g", []string{"t"}, func(context.Context, runner.Record) error { return nil }, nil)
	const limit = 2 * time.Second
	probes := shutdown.NewProbes(m.Runner, 10*time.Second, shutdown.ContactLimit(limit))
	probes.Started()
	kafkatest.WaitFor(t, 15*time.Second, "ready, owning the partition", func() bool {
		ok, _ := probes.Ready()
		return ok && len(m.Runner.Stats().Partitions) == 1
	})
	refuse := c.RefuseGroup(kerr.NotCoordinator.Code)
	t.Cleanup(func() { refuse.Store(false) }) // before the member's: its leave must be answered
	refuse.Store(true)
	cut := time.Now()
	for time.Since(cut) < 3*limit {
		if ok, why := probes.Ready(); !ok {
			t.Logf("unready %v after NOT_COORDINATOR began: %s", time.Since(cut).Round(time.Millisecond), why)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	ms := m.Runner.Stats().Member
	t.Fatalf("still ready %v after every group request was answered NOT_COORDINATOR (contact limit %v): joined %v, contact %v ago, err %q",
		time.Since(cut).Round(time.Millisecond), limit, ms.Joined, time.Since(ms.ContactAt).Round(time.Millisecond), ms.ContactErr)
}
