package share

import (
	"context"
	"errors"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/kgocontact"
)

// Membership returns the source's view of its share group
// (runner.Membership): when the group's coordinator last answered a
// ShareGroupHeartbeat of every session — the oldest of the sessions' last
// answers, zero until each session had one — and the last error of a
// session since. A share group has no generation and franz-go does not
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

// joins tells when every session has been answered a ShareGroupHeartbeat
// once: the source has joined. A share group assigns no partitions to
// report, and the runner learns of a partition only from its first record
// (report), so a member of an idle group would never count as joined.
type joins struct {
	mu     sync.Mutex
	left   int           // sessions not answered yet
	seen   map[int]bool  // sessions answered
	joined chan struct{} // closed once left is 0
}

func newJoins(sessions int) *joins {
	return &joins{left: sessions, seen: map[int]bool{}, joined: make(chan struct{})}
}

// answered is the sessions' kgocontact.Contact.Answered.
func (j *joins) answered(session int, key int16) {
	if kmsg.Key(key) != kmsg.ShareGroupHeartbeat {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.seen[session] {
		return
	}
	j.seen[session] = true
	if j.left--; j.left == 0 {
		close(j.joined)
	}
}

// reportJoined reports an empty assignment to the runner once every session
// was answered, or returns when ctx ends. Run runs it and waits for it.
func (s *Source) reportJoined(ctx context.Context, sink runner.Sink) {
	select {
	case <-s.joins.joined:
	case <-ctx.Done():
		return
	}
	if err := sink.Assigned(ctx, nil); err != nil && !errors.Is(err, runner.ErrStopped) && ctx.Err() == nil {
		s.log.Warn("runner did not take the report that the group was joined", "err", err)
	}
}

// contactOf returns session i's contact hook, which counts its answers in j.
func contactOf(j *joins, i int) *kgocontact.Contact {
	return &kgocontact.Contact{Answered: func(key int16) { j.answered(i, key) }}
}
