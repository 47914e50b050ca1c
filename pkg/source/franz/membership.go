package franz

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	info.ContactAt, info.ContactErr = s.contact.read()
	return info
}

var _ runner.Membership = (*Source)(nil)

// contact is when the coordinator last answered and the last error since.
type contact struct {
	mu  sync.Mutex
	at  time.Time
	err string
}

func (c *contact) answered(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.err = at, ""
}

func (c *contact) failed(err error) {
	msg := err.Error() // franz-go's and net's errors name addresses, never credentials
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = msg
}

func (c *contact) read() (time.Time, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, c.err
}

// groupRequest reports whether key is a request only the group's
// coordinator answers.
func groupRequest(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup,
		kmsg.OffsetCommit, kmsg.OffsetFetch, kmsg.ConsumerGroupHeartbeat:
		return true
	}
	return false
}

// contactHook records the coordinator's answers and the client's errors
// (see Membership). franz-go calls it from its connections' goroutines; it
// only takes contact's lock.
type contactHook struct{ c *contact }

var (
	_ kgo.HookBrokerE2E        = contactHook{}
	_ kgo.HookBrokerConnect    = contactHook{}
	_ kgo.HookGroupManageError = contactHook{}
)

func (h contactHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	switch err := e2e.Err(); {
	case err != nil:
		h.c.failed(err)
	case groupRequest(key):
		h.c.answered(time.Now())
	}
}

func (h contactHook) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.c.failed(err)
	}
}

func (h contactHook) OnGroupManageError(err error) { h.c.failed(err) }

// joinReport tracks whether the runner heard of the member's current
// membership: an assignment reported (even an empty one) since the last
// loss. franz-go calls OnPartitionsAssigned at the start of every group
// session, under the classic protocol and KIP-848 alike, even with nothing
// assigned (setupAssignedAndHeartbeat); onAssigned then reports an empty
// assignment, so a member of a group with more members than partitions is
// reported joined (TestIdleMemberJoined).
type joinReport struct{ reported atomic.Bool }
