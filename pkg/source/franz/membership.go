package franz

import (
	"sync/atomic"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Membership returns the member's view of the group (runner.Membership):
// the member id and generation (under KIP-848, the member epoch) franz-go
// holds, the static instance id, and when the group's coordinator last
// answered one of this member's group requests (JoinGroup, SyncGroup,
// Heartbeat, ConsumerGroupHeartbeat, OffsetCommit, OffsetFetch, LeaveGroup)
// with the last error since. An answer counts as contact whatever its error
// code (REBALANCE_IN_PROGRESS is the coordinator answering); a failed dial,
// write or read of any broker, or the error that ended a group session,
// is recorded in ContactErr. It is safe to call at any time and does not
// block.
func (s *Source) Membership() runner.MemberInfo {
	member, gen := s.cl.GroupMetadata()
	if member == "" {
		gen = runner.NoGeneration
	}
	info := runner.MemberInfo{MemberID: member, Generation: gen}
	if s.cfg.instanceSet {
		info.InstanceID = s.cfg.instanceID
	}
	info.ContactAt, info.ContactErr = s.contact.Read()
	return info
}

var _ runner.Membership = (*Source)(nil)

// joinReport tracks whether the runner heard of the member's current
// membership: an assignment reported (even an empty one) since the last
// loss. franz-go calls OnPartitionsAssigned at the start of every group
// session, under the classic protocol and KIP-848 alike, even with nothing
// assigned (setupAssignedAndHeartbeat); onAssigned then reports an empty
// assignment, so a member of a group with more members than partitions is
// reported joined (TestIdleMemberJoined).
type joinReport struct{ reported atomic.Bool }
