package kafkatest

import (
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// RefuseGroup makes the kfake cluster answer every request of the group
// protocol (JoinGroup, SyncGroup, Heartbeat, OffsetCommit, OffsetFetch,
// LeaveGroup, ConsumerGroupHeartbeat) with code while the returned switch
// is on: as the answer's top-level code, and on each group and partition
// of an OffsetFetch and each partition of an OffsetCommit. It starts off.
// Turn it off in the test's cleanup, before the member's close, so that
// its leave is answered.
func (c *Cluster) RefuseGroup(code int16) *atomic.Bool {
	var refuse atomic.Bool
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
			case *kmsg.ConsumerGroupHeartbeatResponse:
				resp.ErrorCode = code
			case *kmsg.OffsetFetchResponse:
				resp.ErrorCode = code
				for _, g := range req.(*kmsg.OffsetFetchRequest).Groups {
					rg := kmsg.NewOffsetFetchResponseGroup()
					rg.Group, rg.ErrorCode = g.Group, code
					resp.Groups = append(resp.Groups, rg)
				}
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
	return &refuse
}
