// Package runnertest provides an in-memory runner.Source for tests of code
// built on the runner: it delivers records from in-memory partition logs,
// lets a test assign, revoke and lose partitions as a broker would, and
// records every commit. It never talks to Kafka.
package runnertest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/watermark"
)

// Source is an in-memory runner.Source. Its methods are safe for concurrent
// use. Rebalance operations (Assign, Revoke, Lose) are serialized with
// fetching, as franz-go's BlockRebalanceOnPoll serializes them with polls.
type Source struct {
	// BatchSize caps the records of one Fetched call. Default 100.
	BatchSize int
	// Member is the member id Assign reports in each Assignment. Default
	// "runnertest". Set it before the first Assign.
	Member string

	mu        sync.Mutex
	op        chan struct{} // a lock (see lockOp), held while calling the sink
	logs      map[runner.TP][]runner.Record
	committed map[runner.TP]int64
	owned     map[runner.TP]*cursor
	paused    map[runner.TP]bool
	commits   []runner.Offset
	failNext  int
	commitErr error
	closed    bool
	sink      runner.Sink
	ready     chan struct{}
	wake      chan struct{}
	maxBatch  map[runner.TP]int
	hold      chan struct{}
	holding   chan struct{}
	gen       int32 // the generation of the last Assign
}

type cursor struct{ next int } // index into the partition's log

// New returns an empty Source.
func New() *Source {
	return &Source{
		logs:      map[runner.TP][]runner.Record{},
		committed: map[runner.TP]int64{},
		owned:     map[runner.TP]*cursor{},
		paused:    map[runner.TP]bool{},
		ready:     make(chan struct{}),
		wake:      make(chan struct{}, 1),
		op:        make(chan struct{}, 1),
		maxBatch:  map[runner.TP]int{},
	}
}

// Append adds records to their partitions' logs. Offsets must increase per
// partition; gaps are allowed (sparse offsets).
func (s *Source) Append(recs ...runner.Record) {
	s.mu.Lock()
	for _, r := range recs {
		tp := r.TP()
		log := s.logs[tp]
		if n := len(log); n > 0 && log[n-1].Offset >= r.Offset {
			s.mu.Unlock()
			panic(fmt.Sprintf("runnertest: offset %d after %d in %s", r.Offset, log[n-1].Offset, tp))
		}
		s.logs[tp] = append(log, r)
	}
	s.mu.Unlock()
	s.poke()
}

// Run implements runner.Source.
func (s *Source) Run(ctx context.Context, sink runner.Sink) error {
	s.mu.Lock()
	s.sink = sink
	s.mu.Unlock()
	close(s.ready)
	budget := 1 << 30
	for {
		batches := s.take(budget)
		if len(batches) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-s.wake:
				// Only Append, Assign and Resume give take more to
				// hand over; each pokes. No timer: in a synctest bubble
				// a runner that never asks again is a deadlock the
				// bubble reports at once.
				continue
			}
		}
		b, err := sink.Fetched(ctx, batches)
		s.unlockOp()
		if err != nil {
			if errors.Is(err, runner.ErrStopped) || ctx.Err() != nil {
				<-ctx.Done()
				return nil
			}
			return err
		}
		budget = b
	}
}

// take collects the next batches under the op lock, which it leaves locked when it
// returns batches (Run unlocks it after the sink answered).
func (s *Source) take(budget int) []runner.Batch {
	s.lockOp()
	s.mu.Lock()
	defer s.mu.Unlock()
	size := s.BatchSize
	if size <= 0 {
		size = 100
	}
	size = min(size, budget)
	var out []runner.Batch
	tps := make([]runner.TP, 0, len(s.owned))
	for tp := range s.owned {
		tps = append(tps, tp)
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].Topic != tps[j].Topic {
			return tps[i].Topic < tps[j].Topic
		}
		return tps[i].Partition < tps[j].Partition
	})
	for _, tp := range tps {
		c := s.owned[tp]
		if s.paused[tp] || size == 0 {
			continue
		}
		log := s.logs[tp]
		if c.next >= len(log) {
			continue
		}
		end := min(len(log), c.next+size)
		recs := append([]runner.Record(nil), log[c.next:end]...)
		size -= len(recs)
		c.next = end
		if len(recs) > s.maxBatch[tp] {
			s.maxBatch[tp] = len(recs)
		}
		out = append(out, runner.Batch{TP: tp, Records: recs, Position: recs[len(recs)-1].Offset + 1, HighWatermark: log[len(log)-1].Offset + 1})
	}
	if len(out) == 0 {
		s.unlockOp()
	}
	return out
}

// lockOp takes the lock that serializes rebalance operations with fetching.
// It is a channel, not a sync.Mutex, so that a goroutine waiting for it is
// durably blocked in a testing/synctest bubble: synctest.Wait does not
// return while a goroutine waits on a mutex, and a test that revokes in one
// goroutine while the source polls in another would hang.
func (s *Source) lockOp() { s.op <- struct{}{} }

func (s *Source) unlockOp() { <-s.op }

func (s *Source) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Source) sinkReady(ctx context.Context) (runner.Sink, error) {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sink, nil
}

// Assign gives tps to the runner, starting at their committed offsets (the
// first record of the log when nothing was committed), in a new generation:
// one more than the last Assign's, starting at 1, as a group coordinator
// numbers its rebalances.
func (s *Source) Assign(ctx context.Context, tps ...runner.TP) error {
	return s.assign(ctx, func(last int32) int32 { return last + 1 }, tps)
}

// AssignGeneration is Assign in the given generation: -1
// (runner.NoGeneration) for a source that does not know it, the last one
// again for a member that rejoined and got the current generation back, or
// any other to play a broker's numbering. Later Assign calls count on from
// the highest generation given.
func (s *Source) AssignGeneration(ctx context.Context, generation int32, tps ...runner.TP) error {
	return s.assign(ctx, func(int32) int32 { return generation }, tps)
}

func (s *Source) assign(ctx context.Context, next func(last int32) int32, tps []runner.TP) error {
	sink, err := s.sinkReady(ctx)
	if err != nil {
		return err
	}
	s.lockOp()
	defer s.unlockOp()
	s.mu.Lock()
	gen := next(s.gen)
	s.gen = max(s.gen, gen)
	member := s.Member
	if member == "" {
		member = "runnertest"
	}
	as := make([]runner.Assignment, 0, len(tps))
	for _, tp := range tps {
		start := int64(watermark.Unknown)
		next := 0
		if off, ok := s.committed[tp]; ok {
			start = off
			for next < len(s.logs[tp]) && s.logs[tp][next].Offset < off {
				next++
			}
		}
		s.owned[tp] = &cursor{next: next}
		// A new assignment starts unpaused (runner.Source), also one
		// that replaces an assignment of tp without a revoke.
		delete(s.paused, tp)
		as = append(as, runner.Assignment{TP: tp, Start: start, Generation: gen, Member: member})
	}
	s.mu.Unlock()
	err = sink.Assigned(ctx, as)
	s.poke()
	return err
}

// Revoke takes tps back as a cooperative rebalance does: it returns after the
// runner drained them and committed.
func (s *Source) Revoke(ctx context.Context, tps ...runner.TP) error {
	sink, err := s.sinkReady(ctx)
	if err != nil {
		return err
	}
	s.lockOp()
	defer s.unlockOp()
	err = sink.Revoked(ctx, tps, time.Time{})
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.owned, tp)
		delete(s.paused, tp)
	}
	s.mu.Unlock()
	return err
}

// Lose takes tps away as a lost session does. Commits for them after Lose
// returns are refused and recorded as violations.
func (s *Source) Lose(ctx context.Context, tps ...runner.TP) error {
	sink, err := s.sinkReady(ctx)
	if err != nil {
		return err
	}
	s.lockOp()
	defer s.unlockOp()
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.owned, tp)
		delete(s.paused, tp)
	}
	s.mu.Unlock()
	return sink.Lost(ctx, tps)
}

// Pause implements runner.Source.
func (s *Source) Pause(tps []runner.TP) {
	s.mu.Lock()
	for _, tp := range tps {
		if s.owned[tp] != nil {
			s.paused[tp] = true
		}
	}
	s.mu.Unlock()
}

// Resume implements runner.Source.
func (s *Source) Resume(tps []runner.TP) {
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.paused, tp)
	}
	s.mu.Unlock()
	s.poke()
}

// ErrInjected is the error of commits failed by FailCommits.
var ErrInjected = errors.New("runnertest: injected commit failure")

// FailCommits makes the next n commits fail with ErrInjected.
func (s *Source) FailCommits(n int) {
	s.mu.Lock()
	s.failNext = n
	s.mu.Unlock()
}

// Commit implements runner.Source. A commit for a partition this source does
// not own is refused with an error, as a broker would after a generation
// change, and recorded so tests can assert it never happens.
func (s *Source) Commit(ctx context.Context, offsets []runner.Offset) error {
	s.mu.Lock()
	hold, holding := s.hold, s.holding
	s.mu.Unlock()
	if hold != nil {
		select {
		case holding <- struct{}{}:
		default:
		}
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext > 0 {
		s.failNext--
		return ErrInjected
	}
	for _, o := range offsets {
		if s.owned[o.TP] == nil {
			s.commitErr = fmt.Errorf("runnertest: commit of %s@%d for a partition not owned", o.TP, o.Offset)
			return s.commitErr
		}
	}
	for _, o := range offsets {
		if prev, ok := s.committed[o.TP]; ok && o.Offset < prev {
			s.commitErr = fmt.Errorf("runnertest: commit of %s went backward from %d to %d", o.TP, prev, o.Offset)
		}
		s.committed[o.TP] = o.Offset
		s.commits = append(s.commits, o)
	}
	return nil
}

// HoldCommits makes every Commit wait until release is called. held
// receives a value when a commit starts waiting.
func (s *Source) HoldCommits() (held <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hold, holding := make(chan struct{}), make(chan struct{}, 1)
	s.hold, s.holding = hold, holding
	var once sync.Once
	return holding, func() {
		once.Do(func() {
			s.mu.Lock()
			s.hold = nil
			s.mu.Unlock()
			close(hold)
		})
	}
}

// Close implements runner.Source.
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

// Closed reports whether Close was called.
func (s *Source) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Committed returns the last committed offset of tp and whether there is one.
func (s *Source) Committed(tp runner.TP) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	off, ok := s.committed[tp]
	return off, ok
}

// Commits returns every acknowledged commit, in order.
func (s *Source) Commits() []runner.Offset {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]runner.Offset(nil), s.commits...)
}

// Violation returns the first commit for a partition not owned or going
// backward, or nil.
func (s *Source) Violation() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitErr
}

// Paused reports whether tp is paused.
func (s *Source) Paused(tp runner.TP) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused[tp]
}

// End returns the offset after the last record of tp's log.
func (s *Source) End(tp runner.TP) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.logs[tp]
	if len(log) == 0 {
		return 0
	}
	return log[len(log)-1].Offset + 1
}
