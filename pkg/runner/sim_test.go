package runner_test

// The group simulation: seeded schedules of assigns, revokes, losses,
// re-assigns of the same partition (after a revoke, in place of the held
// assignment as a rejoin reports it, and while the old assignment still
// drains), records appended with sparse offsets and few keys, commits that
// fail or are held and answered late, operator pauses and resumes,
// handlers that succeed, fail (retryable or permanent), panic or are slow
// (past the drain budget too), under random options and failure policies,
// and a stop at a random point, over the runner and runnertest's source
// inside a synctest bubble: time is virtual, a seed replays its schedule,
// and a failure shrinks to the shortest cut of its schedule.
//
// The simulation tells assignments apart by the ctx the runner gives a
// handler: every assignment of a partition has its own, so the Done
// channel of an attempt's ctx names the assignment it belongs to (no
// HandlerTimeout is set, which would give each attempt a channel of its
// own).
//
// Checked at every commit, at every handler start, after every step and
// at the end (the numbers are docs/guarantees.md's):
//
//   - a commit never passes a record that has not finished (succeeded,
//     skipped, or dead-lettered with the write acknowledged): not below
//     the assignment's start, in any assignment; from the start on, in
//     the commit's own assignment, so that a completion of an older
//     assignment cannot have moved it (1 and 3);
//   - within an assignment the offsets sent never go backward, nor below
//     the broker's committed offset the assignment started from (2;
//     runnertest's Violation also checks the acknowledged ones across
//     assignments);
//   - no commit for a partition between its loss or revoke and its next
//     assignment (4; runnertest's Violation, for partitions it does not
//     own);
//   - within an assignment, one record of a key (KeyOrder) or of a
//     partition (PartitionOrder) runs at a time, and their first attempts
//     start in offset order (5);
//   - after a quiet period with every fault lifted, the committed offset
//     of every owned partition reaches the end of its log: no assignment
//     was dropped or stalled behind the runner's back (1, lag 0);
//   - Run returns after the stop, and the bubble fails on a goroutine left
//     behind (8).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/internal/simtest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

func TestSimGroupRunner(t *testing.T) {
	t.Parallel()
	simtest.Run(t, simtest.Config{
		Name: "group", Seeds: 200, Parallel: 2, Shrink: true,
		Replay: "go test -race -run TestSimGroupRunner ./pkg/runner/ -sim.seed=%d",
	}, func(s *simtest.Sim) {
		synctest.Test(s.T, func(t *testing.T) { s.T = t; newGroupSim(s).run() })
	})
}

// simAssignment is one assignment of a partition as the runner was told of
// it.
type simAssignment struct {
	id    int
	p     int32
	start int64 // the broker's committed offset it starts from; -1: none
	gen   int32

	finished  map[int64]bool   // records that finished in this assignment
	inflight  map[string]int   // running attempts per lane
	lastStart map[string]int64 // offset of the last first attempt per lane
	sent      int64            // the highest offset sent; -1: none
}

// groupSim is one seed's world. mu guards everything below it.
type groupSim struct {
	s      *simtest.Sim
	src    *simSource
	parts  int
	order  runner.Ordering
	policy string // block, skip, deadletter
	tries  int    // the policy's attempts

	mu       sync.Mutex
	next     map[int32]int64   // the next offset to append
	logs     map[int32][]int64 // appended offsets
	cur      map[int32]*simAssignment
	byDone   map[<-chan struct{}]*simAssignment
	nAsg     int
	finished map[int32]map[int64]bool // records that finished in any assignment
	dlWrites map[int32]map[int64]int
	bad      []string
	sink     runner.Sink
	sinkc    chan struct{}
	stale    int // attempts of an assignment no longer current
}

func newGroupSim(s *simtest.Sim) *groupSim {
	w := &groupSim{s: s, parts: s.Intn(1, 4), next: map[int32]int64{}, logs: map[int32][]int64{},
		cur: map[int32]*simAssignment{}, byDone: map[<-chan struct{}]*simAssignment{},
		finished: map[int32]map[int64]bool{}, dlWrites: map[int32]map[int64]int{}, sinkc: make(chan struct{})}
	w.src = &simSource{Source: runnertest.New(), w: w}
	w.src.BatchSize = s.Intn(1, 50)
	return w
}

func (w *groupSim) failf(format string, args ...any) {
	w.bad = append(w.bad, fmt.Sprintf(format, args...))
}

// simSource is runnertest's source with every commit checked before the
// source takes it, and the runner's sink wrapped to follow assignments.
type simSource struct {
	*runnertest.Source
	w *groupSim
}

func (s *simSource) Run(ctx context.Context, sink runner.Sink) error {
	w := s.w
	w.mu.Lock()
	w.sink = sink
	w.mu.Unlock()
	close(w.sinkc)
	return s.Source.Run(ctx, &simSink{Sink: sink, w: w})
}

func (s *simSource) Commit(ctx context.Context, offsets []runner.Offset) error {
	s.w.checkCommit(offsets)
	return s.Source.Commit(ctx, offsets)
}

// checkCommit checks offsets about to be sent against the assignments and
// the records that finished.
func (w *groupSim) checkCommit(offsets []runner.Offset) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range offsets {
		p := o.TP.Partition
		a := w.cur[p]
		if a == nil {
			w.failf("commit of %s@%d while the partition is not assigned (lost or revoked) (guarantee 4)", o.TP, o.Offset)
			continue
		}
		if o.Offset < a.sent {
			w.failf("commit of %s@%d in assignment %d after %d was sent in it (guarantee 2)", o.TP, o.Offset, a.id, a.sent)
		}
		if a.start >= 0 && o.Offset < a.start {
			w.failf("commit of %s@%d in assignment %d, below its start %d (guarantee 2)", o.TP, o.Offset, a.id, a.start)
		}
		a.sent = max(a.sent, o.Offset)
		for _, off := range w.logs[p] {
			if off >= o.Offset {
				break
			}
			switch {
			case off < a.start && !w.finished[p][off]:
				w.failf("commit of %s@%d passes %d, which never finished (guarantee 1)", o.TP, o.Offset, off)
			case off >= a.start && !a.finished[off]:
				how := "never finished"
				if w.finished[p][off] {
					how = "finished only in an older assignment"
				}
				w.failf("commit of %s@%d in assignment %d (start %d) passes %d, which %s in it (guarantees 1 and 3)",
					o.TP, o.Offset, a.id, a.start, off, how)
			}
		}
	}
}

// simSink follows the assignments the runner is told of. An assignment
// becomes current when Assigned returns: its records are fetched only
// then (runnertest serializes fetches with rebalances), and a commit
// before that is the old assignment's.
type simSink struct {
	runner.Sink
	w *groupSim
}

func (k *simSink) Assigned(ctx context.Context, as []runner.Assignment) error {
	err := k.Sink.Assigned(ctx, as)
	k.w.assigned(as)
	return err
}

func (w *groupSim) assigned(as []runner.Assignment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range as {
		w.nAsg++
		w.cur[a.TP.Partition] = &simAssignment{id: w.nAsg, p: a.TP.Partition, start: max(a.Start, -1), gen: a.Generation,
			finished: map[int64]bool{}, inflight: map[string]int{}, lastStart: map[string]int64{}, sent: -1}
	}
}

func (k *simSink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	return k.w.revoked(func() error { return k.Sink.Revoked(ctx, tps, deadline) }, tps)
}

// revoked runs the sink's Revoked (the source's, or one the simulation
// calls directly) and ends the assignments it was called for, those not
// replaced meanwhile.
func (w *groupSim) revoked(f func() error, tps []runner.TP) error {
	w.mu.Lock()
	was := map[int32]*simAssignment{}
	for _, tp := range tps {
		was[tp.Partition] = w.cur[tp.Partition]
	}
	w.mu.Unlock()
	err := f()
	w.mu.Lock()
	for p, a := range was {
		if w.cur[p] == a {
			delete(w.cur, p)
		}
	}
	w.mu.Unlock()
	return err
}

func (k *simSink) Lost(ctx context.Context, tps []runner.TP) error {
	err := k.Sink.Lost(ctx, tps)
	k.w.mu.Lock()
	for _, tp := range tps {
		delete(k.w.cur, tp.Partition)
	}
	k.w.mu.Unlock()
	return err
}

// assignmentOf returns the assignment whose handler got ctx, nil for one
// no longer current (an attempt that went on past its loss or its drain).
func (w *groupSim) assignmentOf(ctx context.Context, p int32) *simAssignment {
	if a, ok := w.byDone[ctx.Done()]; ok {
		return a
	}
	// First seen: the current assignment's first attempt. An attempt of
	// an older one would have been seen before, unless its very first
	// attempt started after the assignment ended; its ctx is done then.
	var a *simAssignment
	if ctx.Err() == nil {
		a = w.cur[p]
	}
	w.byDone[ctx.Done()] = a
	return a
}

func (w *groupSim) lane(rec runner.Record) string {
	switch w.order {
	case runner.KeyOrder:
		return string(rec.Key)
	case runner.PartitionOrder:
		return ""
	}
	return fmt.Sprint(rec.Offset)
}

// finish records that rec finished in assignment a (nil: no longer
// current). Called with mu held.
func (w *groupSim) finish(a *simAssignment, p int32, off int64) {
	if w.finished[p] == nil {
		w.finished[p] = map[int64]bool{}
	}
	w.finished[p][off] = true
	if a != nil {
		a.finished[off] = true
	}
}

// handler's outcome for an attempt is drawn from the seed, the record,
// its assignment and the attempt's number; from the fourth attempt on it
// succeeds, so that Block moves on too.
func (w *groupSim) handler(drain time.Duration) runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		p, lane, n := rec.Partition, w.lane(rec), runner.Attempt(ctx)
		w.mu.Lock()
		a := w.assignmentOf(ctx, p)
		id := 0
		if a == nil {
			w.stale++
		} else {
			id = a.id
			if w.order != runner.Unordered && a.inflight[lane] > 0 {
				w.failf("%s starts attempt %d in assignment %d while another record of its lane %q runs (guarantee 5)", rec.String(), n, a.id, lane)
			}
			if n == 1 {
				if last, ok := a.lastStart[lane]; ok && w.order != runner.Unordered && rec.Offset <= last {
					w.failf("%s starts in assignment %d after %d of its lane %q started (guarantee 5)", rec.String(), a.id, last, lane)
				}
				a.lastStart[lane] = rec.Offset
			}
			a.inflight[lane]++
		}
		w.mu.Unlock()
		defer func() {
			if a != nil {
				w.mu.Lock()
				a.inflight[lane]--
				w.mu.Unlock()
			}
		}()
		r := rand.New(rand.NewPCG(w.s.Seed, uint64(p)<<56^uint64(rec.Offset)<<16^uint64(id)<<4^uint64(n)))
		u := r.Float64()
		if n >= 4 {
			u = 0
		}
		var err error
		panicked := false
		switch {
		case u < 0.55:
		case u < 0.7:
			time.Sleep(time.Duration(r.Int64N(int64(20 * time.Millisecond))))
		case u < 0.77:
			// Past the drain budget: it goes on after its ctx ends.
			time.Sleep(drain + time.Duration(r.Int64N(int64(drain))))
		case u < 0.87:
			err = fmt.Errorf("failure of %s", rec.String())
		case u < 0.92:
			err = runner.Permanent(fmt.Errorf("permanent failure of %s", rec.String()))
		default:
			err, panicked = errors.New("panic"), true
		}
		w.mu.Lock()
		switch {
		case err == nil:
			w.finish(a, p, rec.Offset)
		case w.policy == "skip" && ctx.Err() == nil && (n >= w.tries || !panicked && runner.KindOf(err) == runner.PermanentKind):
			// The policy skips it: finished (a ctx that ends in between
			// leaves it unfinished, which only weakens the check).
			w.finish(a, p, rec.Offset)
		}
		w.mu.Unlock()
		if panicked {
			panic("simulated panic on " + rec.String())
		}
		return err
	}
}

// WriteDeadLetter fails a record's first writes at random; a write that
// succeeds finishes the record.
func (w *groupSim) WriteDeadLetter(ctx context.Context, _ string, rec runner.Record) error {
	o, ok, err := runner.OriginOf(rec.Headers)
	if err != nil || !ok {
		return fmt.Errorf("no origin in the dead letter: %v", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dlWrites[o.Partition] == nil {
		w.dlWrites[o.Partition] = map[int64]int{}
	}
	w.dlWrites[o.Partition][o.Offset]++
	n := w.dlWrites[o.Partition][o.Offset]
	if r := rand.New(rand.NewPCG(w.s.Seed, uint64(o.Partition)<<56^uint64(o.Offset)<<8^uint64(n))); n < 3 && r.IntN(3) == 0 {
		return errors.New("simulated dead-letter write failure")
	}
	w.finish(w.assignmentOf(ctx, o.Partition), o.Partition, o.Offset)
	return nil
}

// appendRecs appends n records with sparse offsets and few keys to p.
func (w *groupSim) appendRecs(p int32, n int) {
	recs := make([]runner.Record, 0, n)
	w.mu.Lock()
	for range n {
		off := w.next[p]
		w.next[p] = off + 1 + int64(w.s.Rand.IntN(3)) // gaps: compaction, transactions
		w.logs[p] = append(w.logs[p], off)
		recs = append(recs, runner.Record{Topic: topic, Partition: p, Offset: off,
			Key: fmt.Appendf(nil, "k%d", w.s.Rand.IntN(3)), Value: []byte("v")})
	}
	w.mu.Unlock()
	w.src.Append(recs...)
}

// problems returns what went wrong so far.
func (w *groupSim) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]string(nil), w.bad...)
	if err := w.src.Violation(); err != nil {
		out = append(out, err.Error()+" (guarantees 2 and 4)")
	}
	return out
}

func (w *groupSim) run() {
	t, s := w.s.T, w.s
	for p := range int32(w.parts) {
		w.appendRecs(p, s.Intn(0, 40))
	}
	drain := s.Dur(5*time.Millisecond, 100*time.Millisecond)
	high := s.Intn(1, 60)
	w.order = simtest.Pick(s, runner.KeyOrder, runner.PartitionOrder, runner.Unordered)
	w.policy, w.tries = simtest.Pick(s, "block", "skip", "deadletter"), s.Intn(1, 4)
	opts := []runner.Option{runner.Handle(topic, w.handler(drain)), runner.Order(w.order),
		runner.Concurrency(s.Intn(1, 8)), runner.WaterMarks(high, s.Intn(0, high-1)),
		runner.CommitInterval(s.Dur(time.Millisecond, 20*time.Millisecond)), runner.DrainBudget(drain),
		runner.Backoff(time.Millisecond, 10*time.Millisecond), runner.Logger(slog.New(slog.DiscardHandler))}
	switch w.policy {
	case "skip":
		opts = append(opts, runner.Failure(runner.Skip(w.tries)))
	case "deadletter":
		opts = append(opts, runner.Failure(runner.DeadLetter("dlq", w.tries, w)))
	}
	s.Step("%d partitions, batches of %d, %v, %s(%d), drain budget %v, water marks %d", w.parts, w.src.BatchSize, w.order, w.policy, w.tries, drain, high)
	r, err := runner.New(w.src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	<-w.sinkc
	owned := map[int32]bool{}
	paused := map[int32]bool{}
	var release func()
	var gen int32
	steps := s.Intn(5, 40)
schedule:
	for i := 0; i < steps && len(w.problems()) == 0; i++ {
		time.Sleep(s.Dur(0, 50*time.Millisecond))
		p := int32(s.Rand.IntN(w.parts))
		tp := runner.TP{Topic: topic, Partition: p}
		var err error
		switch u := s.Rand.Float64(); {
		case u < 0.15 && !owned[p]:
			if !s.Step("assign %s", tp) {
				break schedule
			}
			gen++
			err = w.src.Assign(ctx, tp)
			owned[p] = err == nil
		case u < 0.3 && owned[p]:
			// Assigned again: a new assignment of the same partition,
			// reported in one of the ways a client can.
			how := simtest.Pick(s, "after a revoke", "in place of the held one", "in place of the held one, same generation", "while the old one drains")
			if !s.Step("assign %s again, %s", tp, how) {
				break schedule
			}
			s.Fault("re-assign")
			switch how {
			case "after a revoke":
				if err = w.src.Revoke(ctx, tp); err == nil {
					gen++
					err = w.src.Assign(ctx, tp)
				}
			case "in place of the held one":
				gen++
				err = w.src.Assign(ctx, tp)
			case "in place of the held one, same generation":
				err = w.src.AssignGeneration(ctx, gen, tp)
			default:
				err = w.reassignWhileDraining(ctx, tp)
				gen++
			}
			owned[p] = err == nil
		case u < 0.4 && owned[p]:
			if !s.Step("revoke %s", tp) {
				break schedule
			}
			s.Fault("revoke")
			err = w.src.Revoke(ctx, tp)
			owned[p] = false
		case u < 0.48 && owned[p]:
			if !s.Step("lose %s", tp) {
				break schedule
			}
			s.Fault("loss")
			err = w.src.Lose(ctx, tp)
			owned[p] = false
		case u < 0.65:
			n := s.Intn(1, 30)
			if !s.Step("append %d to %s", n, tp) {
				break schedule
			}
			w.appendRecs(p, n)
		case u < 0.73:
			n := s.Intn(1, 3)
			if !s.Step("fail the next %d commits", n) {
				break schedule
			}
			s.Fault("failed commit")
			w.src.FailCommits(n)
		case u < 0.8 && release == nil:
			if !s.Step("hold the commits") {
				break schedule
			}
			s.Fault("held commits")
			_, release = w.src.HoldCommits()
		case u < 0.85 && release != nil:
			if !s.Step("answer the held commits") {
				break schedule
			}
			release()
			release = nil
		case u < 0.95:
			if !s.Step("operator: %s %s", map[bool]string{true: "resume", false: "pause"}[paused[p]], tp) {
				break schedule
			}
			if paused[p] {
				err = r.ResumePartitions(ctx, tp)
			} else {
				s.Fault("pause")
				err = r.PausePartitions(ctx, tp)
			}
			paused[p] = !paused[p]
		}
		if err != nil {
			// A drain past its budget, a final commit refused: the
			// runner says so, and the schedule goes on.
			s.Step("%s: %v", tp, err)
		}
	}
	settle := len(w.problems()) == 0 && s.Chance(0.8)
	if settle {
		// Everything lifted: every owned partition must commit to its end.
		if release != nil {
			release()
			release = nil
		}
		w.src.FailCommits(0)
		for p, ok := range paused {
			if ok {
				if err := r.ResumePartitions(ctx, runner.TP{Topic: topic, Partition: p}); err != nil {
					t.Errorf("resume %d: %v", p, err)
				}
			}
		}
	}
	if settle {
		s.Step("quiet: every fault lifted")
		w.settle(r, owned)
	}
	if release != nil {
		release()
	}
	how := simtest.Pick(s, "cancel Run's ctx", "Shutdown", "Close")
	s.Step("stop: %s", how)
	switch how {
	case "cancel Run's ctx":
		cancel()
	case "Shutdown":
		sctx, scancel := context.WithTimeout(context.Background(), s.Dur(0, 3*drain))
		if err := r.Shutdown(sctx); err != nil {
			s.Step("Shutdown: %v", err)
		}
		scancel()
	default:
		if err := r.Close(); err != nil {
			s.Step("Close: %v", err)
		}
	}
	select {
	case err := <-errc:
		if err != nil {
			s.Step("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("Run did not return within a minute of its stop (guarantee 8)")
	}
	cancel()
	// Handlers past their budget finish in the background; Run waited
	// for them, so nothing of the runner's may be left (the bubble checks).
	synctest.Wait()
	for _, b := range w.problems() {
		t.Error(b)
	}
}

// settle waits, with every fault lifted, until every owned partition
// committed to the end of its log (guarantee 1: lag 0), and fails the seed
// when one does not within a minute.
func (w *groupSim) settle(r *runner.Runner, owned map[int32]bool) {
	var ps []int32
	for p, ok := range owned {
		if ok {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	deadline := time.Now().Add(time.Minute)
	for {
		var behind []string
		for _, p := range ps {
			tp := runner.TP{Topic: topic, Partition: p}
			end := w.src.End(tp)
			if end == 0 {
				continue
			}
			if got, _ := w.src.Committed(tp); got != end {
				behind = append(behind, fmt.Sprintf("%s committed %d of %d", tp, got, end))
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.mu.Lock()
			w.failf("a minute after every fault was lifted, owned partitions are behind (guarantee 1, lag 0): %v; stats %+v", behind, r.Stats())
			w.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reassignWhileDraining revokes tp through the sink, as a client whose
// revoke callback runs apart from its assignments would, and assigns it
// again while that drain runs: the drain must neither wait for nor end
// the new assignment.
func (w *groupSim) reassignWhileDraining(ctx context.Context, tp runner.TP) error {
	w.mu.Lock()
	sink := w.sink
	w.mu.Unlock()
	revoked := make(chan error, 1)
	go func() {
		revoked <- w.revoked(func() error { return sink.Revoked(ctx, []runner.TP{tp}, time.Time{}) }, []runner.TP{tp})
	}()
	// The revoke reaches the runner first: the new assignment comes
	// while it drains (or after it finished, when nothing was in flight).
	synctest.Wait()
	var rerr error
	draining := true
	select {
	case rerr = <-revoked:
		draining = false
	default:
		w.s.Fault("assigned while draining")
	}
	err := w.src.Assign(ctx, tp)
	if draining {
		select {
		case rerr = <-revoked:
		case <-time.After(time.Minute):
			w.mu.Lock()
			w.failf("Revoked of %s still waits a minute after its assignment was replaced", tp)
			w.mu.Unlock()
		}
	}
	if rerr != nil {
		w.s.Step("%s: the drained assignment: %v", tp, rerr)
	}
	return err
}
