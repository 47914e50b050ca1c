package franz

import (
	"context"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// fetchControl is the part of the client that flow control calls: pausing
// and resuming fetches. *kgo.Client implements it; tests count the calls.
type fetchControl interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// parkWait is how long Run waits for the runner to resume a paused
// partition whose records it holds before it parks them and polls again.
const parkWait = 10 * time.Millisecond

// awaitResume waits up to parkWait for a Resume; false if none came (or ctx
// ended, which the poll then reports).
func (s *Source) awaitResume(ctx context.Context) bool {
	t := time.NewTimer(parkWait)
	defer t.Stop()
	select {
	case <-s.resumed:
		return true
	case <-t.C:
	case <-ctx.Done():
	case <-s.closed:
	}
	return false
}

// applyFlow tells the client what changed in the partitions to fetch since
// the last call, with at most one PauseFetchPartitions and one
// ResumeFetchPartitions call; flowMu must be held (so that a Pause after
// the check is not undone by a stale resume). Run's goroutine calls it
// before each poll. O(changed partitions) plus franz-go's copy of its
// paused set per call.
func (s *Source) applyFlow() {
	var pause, resume map[string][]int32
	for tp := range s.flowDirty {
		_, rewinding := s.rewind[tp]
		want := s.paused[tp] || s.parkedTPs[tp] || rewinding
		if want == s.fetchPaused[tp] {
			continue
		}
		if want {
			s.fetchPaused[tp] = true
			pause = addTP(pause, tp)
		} else {
			delete(s.fetchPaused, tp)
			resume = addTP(resume, tp)
		}
	}
	clear(s.flowDirty)
	if pause != nil {
		s.fc.PauseFetchPartitions(pause)
	}
	if resume != nil {
		s.fc.ResumeFetchPartitions(resume)
	}
}

func addTP(m map[string][]int32, tp runner.TP) map[string][]int32 {
	if m == nil {
		m = make(map[string][]int32)
	}
	m[tp.Topic] = append(m[tp.Topic], tp.Partition)
	return m
}

// Pause stops fetching tps until Resume, and stops handing over the records
// Run already took for them (they are kept, not fetched again); records of
// tps the client buffered but Run did not take yet are dropped by the
// client and fetched again after Resume. The client is told with Run's
// next poll (see flowMu). It does not block.
func (s *Source) Pause(tps []runner.TP) {
	if len(tps) == 0 {
		return
	}
	s.flowMu.Lock()
	for _, tp := range tps {
		s.paused[tp] = true
		s.flowDirty[tp] = true
	}
	s.flowMu.Unlock()
}

// Resume starts fetching tps again, which takes effect with the next fetch
// request to their broker (within FetchMaxWait), and hands over the records
// Run holds for them at once; either ends a poll Run waits in. It does not
// block.
func (s *Source) Resume(tps []runner.TP) {
	if len(tps) == 0 {
		return
	}
	end := false
	s.flowMu.Lock()
	for _, tp := range tps {
		delete(s.paused, tp)
		if s.parkedTPs[tp] {
			// Fetched again only once its parked records are handed
			// over (take), so parked records never pile up.
			s.wake, end = true, true
			continue
		}
		s.flowDirty[tp] = true
		end = end || s.fetchPaused[tp]
	}
	if end && s.pollCancel != nil {
		s.pollCancel()
	}
	s.flowMu.Unlock()
	select {
	case s.resumed <- struct{}{}:
	default:
	}
}
