package share

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
	"github.com/tidemark/tidemark/pkg/runner"
)

// Membership returns the source's view of its share group
// (runner.Membership): when the group's coordinator last served a
// ShareGroupHeartbeat of every session — the oldest of the sessions' last
// such answers, zero until each session had one — and the last error of a
// session since. The answers are read off the sessions' connections
// (kgocontact.WireOptions): one refusing the member (an authorization
// failure, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, NOT_COORDINATOR...) is
// no contact and is recorded as the error. A share group has no generation and franz-go does not
// expose a share member's id: MemberID is "" and Generation -1. It is safe
// to call at any time and does not block.
func (s *Source) Membership() runner.MemberInfo {
	info := runner.MemberInfo{Generation: runner.NoGeneration}
	for i, ss := range s.sessions {
		at, err := ss.contact.Read()
		if i == 0 || at.Before(info.ContactAt) {
			info.ContactAt = at
		}
		if info.ContactErr == "" && err != "" {
			info.ContactErr = err
		}
	}
	return info
}

var _ runner.Membership = (*Source)(nil)

// joins tells whether every session is a member of the share group: its
// last ShareGroupHeartbeat answer had no error and a member epoch (above
// 0). A share group assigns no partitions to report, and the runner learns
// of a partition only from its first record (report), so a member of an
// idle group would otherwise never count as joined. A refusal (an
// authorization failure, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH,
// NOT_COORDINATOR...) takes the session out until a heartbeat is served
// again; a heartbeat that gets no answer does not (Membership's ContactAt
// ages instead).
type joins struct {
	mu      sync.Mutex
	member  []bool        // per session: in the group
	changed chan struct{} // capacity 1: a session came in or went out
}

func newJoins(sessions int) *joins {
	return &joins{member: make([]bool, sessions), changed: make(chan struct{}, 1)}
}

// heard is the sessions' kgocontact.Contact.Answered and Refused.
func (j *joins) heard(session int, a kgocontact.Answer) {
	if kmsg.Key(a.Key) != kmsg.ShareGroupHeartbeat {
		return
	}
	in := a.Err == nil && a.Epoch > 0
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.member[session] == in {
		return
	}
	j.member[session] = in
	select {
	case j.changed <- struct{}{}:
	default:
	}
}

// all reports whether every session is in the group.
func (j *joins) all() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !slices.Contains(j.member, false)
}

// reportJoined reports to the runner an empty assignment when every session
// is in the group, and an empty loss when one leaves it after, until ctx
// ends. Run runs it and waits for it.
func (s *Source) reportJoined(ctx context.Context, sink runner.Sink) {
	reported := false
	for {
		select {
		case <-s.joins.changed:
		case <-ctx.Done():
			return
		}
		var err error
		switch all := s.joins.all(); {
		case all && !reported:
			err, reported = sink.Assigned(ctx, nil), true
		case !all && reported:
			err, reported = sink.Lost(ctx, nil), false
		}
		if err != nil && !errors.Is(err, runner.ErrStopped) && ctx.Err() == nil {
			s.log.Warn("runner did not take the report of the group membership", "joined", reported, "err", err)
		}
	}
}

// contactOf returns session i's contact hook, which tells j of its
// heartbeats' answers.
func contactOf(j *joins, i int) *kgocontact.Contact {
	heard := func(a kgocontact.Answer) { j.heard(i, a) }
	return &kgocontact.Contact{Answered: heard, Refused: heard}
}
