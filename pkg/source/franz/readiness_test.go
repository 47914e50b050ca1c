package franz_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"))
	m := startMember(t, c, "g", []string{"t"}, func(context.Context, runner.Record) error { return nil }, nil)
	const limit = 2 * time.Second
	probes := shutdown.NewProbes(m.Runner, 10*time.Second, shutdown.ContactLimit(limit))
	probes.Started()
	kafkatest.WaitFor(t, 15*time.Second, "ready, owning the partition", func() bool {
		ok, _ := probes.Ready()
		return ok && len(m.Runner.Stats().Partitions) == 1
	})
	var refuse atomic.Bool
	t.Cleanup(func() { refuse.Store(false) }) // before the member's: its leave must be answered
	code := kerr.NotCoordinator.Code
	for _, k := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit, kmsg.OffsetFetch, kmsg.LeaveGroup, kmsg.ConsumerGroupHeartbeat} {
		c.Fake.ControlKey(int16(k), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.Fake.KeepControl()
			if !refuse.Load() {
				return nil, nil, false
			}
			resp := req.ResponseKind()
			resp.SetVersion(req.GetVersion())
			switch resp := resp.(type) {
			case *kmsg.JoinGroupResponse:
				resp.ErrorCode = code
			case *kmsg.SyncGroupResponse:
				resp.ErrorCode = code
			case *kmsg.HeartbeatResponse:
				resp.ErrorCode = code
			case *kmsg.LeaveGroupResponse:
				resp.ErrorCode = code
			case *kmsg.OffsetFetchResponse:
				resp.ErrorCode = code
				for _, g := range req.(*kmsg.OffsetFetchRequest).Groups {
					rg := kmsg.NewOffsetFetchResponseGroup()
					rg.Group, rg.ErrorCode = g.Group, code
					resp.Groups = append(resp.Groups, rg)
				}
			case *kmsg.ConsumerGroupHeartbeatResponse:
				resp.ErrorCode = code
			case *kmsg.OffsetCommitResponse:
				for _, rt := range req.(*kmsg.OffsetCommitRequest).Topics {
					st := kmsg.NewOffsetCommitResponseTopic()
					st.Topic = rt.Topic
					for _, rp := range rt.Partitions {
						sp := kmsg.NewOffsetCommitResponseTopicPartition()
						sp.Partition, sp.ErrorCode = rp.Partition, code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
			}
			return resp, nil, true
		})
	}
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
