package franz

import (
	"context"
	"sync"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// flow is the source's flow control: what the runner paused, which
// partitions the held records keep from the client, what the client was
// told, and the wake-up of a poll.
//
// A partition is paused at the client while the runner paused it, records
// of it are parked (so parked records never pile up), or records of it
// that did not fit in parked wait to be fetched again (refetch). Pause and
// Resume only record the change: franz-go copies its whole set of paused
// partitions on each PauseFetchPartitions and ResumeFetchPartitions call,
// so a call per toggle made water marks that flap cost O(paused) per
// toggle. Run tells the client once per poll, just before it (startPoll):
// at most one call of each. A pause that waits for it costs nothing the
// runner sees (a poll strips paused partitions, and Run keeps records of
// paused partitions from the runner); a resume must not wait for a poll
// that may not end (everything else paused), so Resume ends the poll Run
// waits in when the client has to fetch again, as it does when parked
// records can go to the runner.
//
// mu guards every field but fc (set before Run) and resumed. Each method
// takes mu and releases it before it returns, but applyLocked, which its
// caller (startPoll) calls with mu held. mu is held across the client's
// PauseFetchPartitions and ResumeFetchPartitions, which send no request
// (franz-go v1.22.3: they swap the client's paused set under its own lock,
// which nothing else in the client holds, and a resume wakes the fetch
// loops that have nothing to do), and never across I/O or a call into the
// runner. The hold's lock is taken before mu, never after: flow calls
// nothing of the hold's.
type flow struct {
	fc fetchControl

	mu          sync.Mutex
	paused      map[runner.TP]bool // what the runner paused
	parked      map[runner.TP]bool // records of it are parked
	refetch     map[runner.TP]bool // its fetch position is to be set back
	fetchPaused map[runner.TP]bool // paused at the client
	dirty       map[runner.TP]bool // paused, parked or assigned since the last applyLocked
	pollCancel  context.CancelFunc // ends the poll Run waits in, nil outside one
	wake        bool               // a Resume asks Run to skip its next poll

	resumed chan struct{} // capacity 1: a Resume happened
}

// fetchControl is the part of the client that flow control calls: pausing
// and resuming fetches. *kgo.Client implements it; tests count the calls.
type fetchControl interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

func newFlow(fc fetchControl) *flow {
	return &flow{
		fc:          fc,
		paused:      map[runner.TP]bool{},
		parked:      map[runner.TP]bool{},
		refetch:     map[runner.TP]bool{},
		fetchPaused: map[runner.TP]bool{},
		dirty:       map[runner.TP]bool{},
		resumed:     make(chan struct{}, 1),
	}
}

// parkWait is how long Run waits for the runner to resume a paused
// partition whose records it holds before it parks them and polls again.
const parkWait = 10 * time.Millisecond

// awaitResume waits up to parkWait for a Resume; false if none came (or ctx
// ended, which the poll then reports, or closed was closed).
func (f *flow) awaitResume(ctx context.Context, closed <-chan struct{}) bool {
	t := time.NewTimer(parkWait)
	defer t.Stop()
	select {
	case <-f.resumed:
		return true
	case <-t.C:
	case <-ctx.Done():
	case <-closed:
	}
	return false
}

// applyLocked tells the client what changed in the partitions to fetch
// since the last call, with at most one PauseFetchPartitions and one
// ResumeFetchPartitions call; mu must be held (so that a Pause after the
// check is not undone by a stale resume). Run's goroutine calls it before
// each poll (startPoll). O(changed partitions) plus franz-go's copy of its
// paused set per call.
func (f *flow) applyLocked() {
	var pause, resume map[string][]int32
	for tp := range f.dirty {
		want := f.paused[tp] || f.parked[tp] || f.refetch[tp]
		if want == f.fetchPaused[tp] {
			continue
		}
		if want {
			f.fetchPaused[tp] = true
			pause = addTP(pause, tp)
		} else {
			delete(f.fetchPaused, tp)
			resume = addTP(resume, tp)
		}
	}
	clear(f.dirty)
	if pause != nil {
		f.fc.PauseFetchPartitions(pause)
	}
	if resume != nil {
		f.fc.ResumeFetchPartitions(resume)
	}
}

func addTP(m map[string][]int32, tp runner.TP) map[string][]int32 {
	if m == nil {
		m = make(map[string][]int32)
	}
	m[tp.Topic] = append(m[tp.Topic], tp.Partition)
	return m
}

// startPoll readies the poll Run is about to make: it tells the client what
// changed (applyLocked) and lets Resume end the poll with cancel. It
// returns false, and does neither, when a Resume asked for the poll to be
// skipped: parked records can go to the runner.
func (f *flow) startPoll(cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.wake {
		f.wake = false
		return false
	}
	f.applyLocked()
	f.pollCancel = cancel
	return true
}

// endPoll ends what startPoll began: a Resume no longer ends the poll.
func (f *flow) endPoll() {
	f.mu.Lock()
	f.pollCancel, f.wake = nil, false
	f.mu.Unlock()
}

// Pause stops fetching tps until Resume, and stops handing over the records
// Run already took for them (they are kept, not fetched again); records of
// tps the client buffered but Run did not take yet are dropped by the
// client and fetched again after Resume. The client is told with Run's
// next poll (see flow). It does not block, and may be called from inside
// any Sink call the source makes (the runner pauses partitions before
// Fetched and Assigned return): the source holds no lock Pause takes
// across a Sink call.
func (s *Source) Pause(tps []runner.TP) {
	if len(tps) == 0 {
		return
	}
	s.flow.pause(tps)
}

// Resume starts fetching tps again, which takes effect with the next fetch
// request to their broker (within FetchMaxWait), and hands over the records
// Run holds for them at once; either ends a poll Run waits in. It does not
// block, and may be called from inside any Sink call, as Pause.
func (s *Source) Resume(tps []runner.TP) {
	if len(tps) == 0 {
		return
	}
	s.flow.resume(tps)
}

func (f *flow) pause(tps []runner.TP) {
	f.mu.Lock()
	for _, tp := range tps {
		f.paused[tp] = true
		f.dirty[tp] = true
	}
	f.mu.Unlock()
}

func (f *flow) resume(tps []runner.TP) {
	end := false
	f.mu.Lock()
	for _, tp := range tps {
		delete(f.paused, tp)
		if f.parked[tp] {
			// Fetched again only once its parked records are handed
			// over (take), so parked records never pile up.
			f.wake, end = true, true
			continue
		}
		f.dirty[tp] = true
		end = end || f.fetchPaused[tp]
	}
	if end && f.pollCancel != nil {
		f.pollCancel()
	}
	f.mu.Unlock()
	select {
	case f.resumed <- struct{}{}:
	default:
	}
}

// pausedOf appends to dst, for each of tps, whether the runner paused it.
func (f *flow) pausedOf(tps []runner.TP, dst []bool) []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range tps {
		dst = append(dst, f.paused[tps[i]])
	}
	return dst
}

// pausedCount is how many partitions the runner paused.
func (f *flow) pausedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.paused)
}

// setParked records whether records of tp are parked: it is not fetched
// while they are.
func (f *flow) setParked(tp runner.TP, parked bool) {
	f.mu.Lock()
	if parked {
		f.parked[tp] = true
	} else {
		delete(f.parked, tp)
	}
	f.dirty[tp] = true
	f.mu.Unlock()
}

// setRefetch records that tp's fetch position is to be set back: it is not
// fetched until refetched is called.
func (f *flow) setRefetch(tp runner.TP) {
	f.mu.Lock()
	f.refetch[tp] = true
	f.dirty[tp] = true
	f.mu.Unlock()
}

// refetched records that the fetch positions of tps were set back: they
// may be fetched again from the next poll.
func (f *flow) refetched(tps []runner.TP) {
	f.mu.Lock()
	for _, tp := range tps {
		delete(f.refetch, tp)
		f.dirty[tp] = true
	}
	f.mu.Unlock()
}

// forget drops what flow knows of tps, whose assignment ended or is new,
// but what the client was told: a new assignment starts unpaused (the
// runner does not resume what it revokes or loses while paused).
func (f *flow) forget(tps []runner.TP) {
	f.mu.Lock()
	for _, tp := range tps {
		delete(f.parked, tp)
		delete(f.refetch, tp)
		delete(f.paused, tp)
		f.dirty[tp] = true
	}
	f.mu.Unlock()
}

// assigned resumes tps at the client at once, not with the next poll:
// franz-go starts fetching them as the assign callback returns, and Run may
// be waiting in a poll. It drops a pause franz-go (or this source) may
// still hold from an earlier assignment of the same partitions.
func (f *flow) assigned(tps []runner.TP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tp := range tps {
		delete(f.fetchPaused, tp)
		delete(f.dirty, tp)
	}
	f.fc.ResumeFetchPartitions(mapOf(tps))
}
