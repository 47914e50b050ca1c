//go:build integration

package integration_test

// A spy around a Source that checks invariant 2 (committed offsets never go
// backward) on every commit it sends and every one acknowledged, and
// records each member's assignments.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// spyLog records, for every member wrapped by spySource, each assignment,
// revoke and loss it reports and each commit it sends and how the commit
// was answered, in the order they happened, and checks invariant 2 on every
// one of them (not on samples).
type spyLog struct {
	mu sync.Mutex
	// per member and partition: the current assignment's highest offset
	// sent and acknowledged; absent when the member does not own it.
	owned map[string]map[runner.TP]*spyAssignment
	// per partition: the last acknowledged commit by any member.
	lastAck     map[runner.TP]spyAck
	lost        map[string]int // member → partitions it reported lost
	assignments int
	sent, acked int
	violations  []string
}

type spyAssignment struct{ sent, acked int64 }

type spyAck struct {
	member string
	offset int64
}

func newSpyLog() *spyLog {
	return &spyLog{owned: map[string]map[runner.TP]*spyAssignment{}, lastAck: map[runner.TP]spyAck{}, lost: map[string]int{}}
}

func (l *spyLog) violate(format string, a ...any) {
	if len(l.violations) < 10 {
		l.violations = append(l.violations, fmt.Sprintf(format, a...))
	}
}

// ownedBy returns how many partitions member owns now.
func (l *spyLog) ownedBy(member string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.owned[member])
}

// spySource wraps a Source: its Run reports through a sink that records
// ownership in log, and its Commit records each offset sent and whether it
// was acknowledged.
type spySource struct {
	runner.Source
	name string
	log  *spyLog
}

func (s *spySource) Run(ctx context.Context, sink runner.Sink) error {
	return s.Source.Run(ctx, spySink{Sink: sink, s: s})
}

func (s *spySource) Commit(ctx context.Context, offsets []runner.Offset) error {
	l := s.log
	l.mu.Lock()
	for _, o := range offsets {
		a := l.owned[s.name][o.TP]
		switch {
		case a == nil:
			l.violate("member %s sent a commit of %d for %s, which it does not own", s.name, o.Offset, o.TP)
		case o.Offset < a.sent:
			l.violate("member %s sent %d for %s after sending %d in the same assignment", s.name, o.Offset, o.TP, a.sent)
		default:
			a.sent = o.Offset
		}
		l.sent++
	}
	l.mu.Unlock()

	err := s.Source.Commit(ctx, offsets)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range offsets {
		l.acked++
		if a := l.owned[s.name][o.TP]; a != nil {
			if o.Offset < a.acked {
				l.violate("member %s: %s acknowledged at %d after %d in the same assignment", s.name, o.TP, o.Offset, a.acked)
			}
			a.acked = max(a.acked, o.Offset)
		}
		// Across members: a clean handoff (revoke, final commit, then the
		// next assignment) keeps the group's committed offset rising too.
		if last, ok := l.lastAck[o.TP]; ok && o.Offset < last.offset {
			l.violate("%s: member %s's acknowledged commit %d is below member %s's earlier %d", o.TP, s.name, o.Offset, last.member, last.offset)
		}
		if last := l.lastAck[o.TP]; o.Offset >= last.offset {
			l.lastAck[o.TP] = spyAck{member: s.name, offset: o.Offset}
		}
	}
	return nil
}

type spySink struct {
	runner.Sink
	s *spySource
}

func (k spySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	l := k.s.log
	l.mu.Lock()
	if l.owned[k.s.name] == nil {
		l.owned[k.s.name] = map[runner.TP]*spyAssignment{}
	}
	for _, a := range parts {
		l.owned[k.s.name][a.TP] = &spyAssignment{sent: -1, acked: -1}
		l.assignments++
	}
	l.mu.Unlock()
	return k.Sink.Assigned(ctx, parts)
}

// Revoked and Lost end the assignment after the runner has acted: the
// final commit of a revoke, and a commit in flight that Lost waits for,
// still belong to it.
func (k spySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	err := k.Sink.Revoked(ctx, tps, deadline)
	k.s.log.drop(k.s.name, tps)
	return err
}

func (k spySink) Lost(ctx context.Context, tps []runner.TP) error {
	err := k.Sink.Lost(ctx, tps)
	k.s.log.drop(k.s.name, tps)
	k.s.log.mu.Lock()
	k.s.log.lost[k.s.name] += len(tps)
	k.s.log.mu.Unlock()
	return err
}

func (l *spyLog) drop(member string, tps []runner.TP) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, tp := range tps {
		delete(l.owned[member], tp)
	}
}
