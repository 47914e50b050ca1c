package share

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TakeForTest hands recs to session i as one poll returned at now (take),
// and returns the batches the runner would get.
func (s *Source) TakeForTest(i int, recs []*kgo.Record, now time.Time) []runner.Batch {
	b, _, _ := s.sessions[i].take(recs, now)
	return b
}

// ReleaseForTest is session i's release of recs (the runner took none).
func (s *Source) ReleaseForTest(i int, recs []*kgo.Record) { s.sessions[i].release(recs) }

// HeldForTest returns how many records session i holds, and the source.
func (s *Source) HeldForTest(i int) (session, source int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions[i].held), len(s.held)
}

// PollCapForTest has every session poll at most n records, fewer than its
// fetch brings: the client keeps the rest buffered, their locks running,
// as it does with a fetch that slipped out while a poll returned.
func (s *Source) PollCapForTest(n int) {
	for _, ss := range s.sessions {
		ss.pollCap = n
	}
}

// LockRecordsForTest has every record whose Value is in until acquired
// until its time (records a test makes carry no lock); it returns the
// function that undoes it.
func LockRecordsForTest(until map[string]time.Time) (undo func()) {
	old := acquisitionDeadline
	acquisitionDeadline = func(r *kgo.Record) time.Time {
		if t, ok := until[string(r.Value)]; ok {
			return t
		}
		return old(r)
	}
	return func() { acquisitionDeadline = old }
}

// PollForTest is session i's handling of a poll of recs returned at now,
// up to the hand-over: take, then the lone release of the records whose
// lock had expired. It returns the batches the runner would get.
func (s *Source) PollForTest(i int, recs []*kgo.Record, now time.Time) []runner.Batch {
	ss := s.sessions[i]
	b, _, stale := ss.take(recs, now)
	if len(stale) > 0 {
		ss.releaseAlone(context.Background(), stale)
	}
	return b
}

// WatchAcksForTest has every ack the source marks reported to f instead
// of marked on the record; it returns the function that undoes it.
func WatchAcksForTest(f func(r *kgo.Record, status kgo.AckStatus)) (undo func()) {
	old := ackRecord
	ackRecord = f
	return func() { ackRecord = old }
}
