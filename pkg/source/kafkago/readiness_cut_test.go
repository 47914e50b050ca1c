package kafkago_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// TestReadinessCoordinatorOnlyCut: the coordinator stops answering the
// group's requests (its connections close on JoinGroup, SyncGroup,
// Heartbeat, OffsetCommit, OffsetFetch, LeaveGroup) while the brokers
// still answer FindCoordinator and Metadata. The member cannot reach its
// coordinator, so readiness must fail within the contact limit. kafka-go
// re-finds the coordinator every JoinGroupBackoff, and Membership counts
// the FindCoordinator answer as the coordinator's: ContactAt stays fresh
// and the member stays ready for as long as the coordinator is cut.
func TestReadinessCoordinatorOnlyCut(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"))
	src, err := kafkago.New(c.Brokers(), "g", []string{"t"},
		kafkago.SessionTimeout(2*time.Second), kafkago.RebalanceTimeout(3*time.Second),
		kafkago.HeartbeatInterval(100*time.Millisecond), kafkago.JoinGroupBackoff(200*time.Millisecond),
		kafkago.MaxWait(100*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(20*time.Millisecond), runner.DrainBudget(time.Second))
	if err != nil {
		t.Fatalf("runner.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		c.Fake.Close() // the shutdown's leave cannot reach a cut coordinator
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-done
	})
	const limit = 2 * time.Second
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(limit))
	probes.Started()
	kafkatest.WaitFor(t, 15*time.Second, "ready, owning the partition", func() bool {
		ok, _ := probes.Ready()
		return ok && len(r.Stats().Partitions) == 1
	})

	for _, k := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit, kmsg.OffsetFetch, kmsg.LeaveGroup} {
		c.Fake.ControlKey(int16(k), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.Fake.KeepControl()
			return nil, context.DeadlineExceeded, true // closes the connection
		})
	}
	cut := time.Now()
	for time.Since(cut) < 3*limit {
		if ok, _ := probes.Ready(); !ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := r.Stats().Member
	t.Fatalf("still ready %v after the coordinator stopped answering the group (contact limit %v): joined %v, contact %v ago, err %q",
		time.Since(cut).Round(time.Millisecond), limit, m.Joined, time.Since(m.ContactAt).Round(time.Millisecond), m.ContactErr)
}
