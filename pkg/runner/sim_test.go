package runner_test

// The group simulation: seeded schedules of assigns, revokes, losses,
// re-assigns of the same partition, records appended with sparse
// offsets, commits that fail or are held and answered late, handlers
// that are slow (past the drain budget too), fail and panic, and a stop
// at a random point, over the runner and runnertest's source inside a
// synctest bubble (virtual time: a seed replays exactly, and its
// failure shrinks to the shortest cut of its schedule). Checked at every
// commit and at the end (docs/guarantees.md):
//
//   - a commit never passes a delivered record whose handler has not
//     finished (guarantees 1 and 2: at-least-once, the contiguous
//     completed prefix);
//   - commits never go backward and none is made for a partition the
//     member does not own, a lost or revoked one included (guarantees 3
//     and 4, runnertest's Violation);
//   - Run returns after the stop and leaves no goroutine (guarantee 8:
//     the bubble fails on a goroutine still blocked when it ends).

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

// groupSim is one seed's world.
type groupSim struct {
	s     *simtest.Sim
	src   *simSource
	parts int

	mu       sync.Mutex
	next     map[int32]int64   // the next offset to append, per partition
	logs     map[int32][]int64 // appended offsets, per partition
	finished map[runner.TP]map[int64]bool
	attempts map[runner.TP]map[int64]int
	bad      []string
}

// simSource is runnertest's source with every commit checked against
// the handlers' finished records before the source takes it.
type simSource struct {
	*runnertest.Source
	w *groupSim
}

func (s *simSource) Commit(ctx context.Context, offsets []runner.Offset) error {
	w := s.w
	w.mu.Lock()
	for _, o := range offsets {
		for _, off := range w.logs[o.TP.Partition] {
			if off >= o.Offset {
				break
			}
			if !w.finished[o.TP][off] {
				w.bad = append(w.bad, fmt.Sprintf("commit of %s@%d passes %d, whose handler has not finished (attempts %d)",
					o.TP, o.Offset, off, w.attempts[o.TP][off]))
			}
		}
	}
	w.mu.Unlock()
	return s.Source.Commit(ctx, offsets)
}

func newGroupSim(s *simtest.Sim) *groupSim {
	w := &groupSim{s: s, parts: s.Intn(1, 4), next: map[int32]int64{}, logs: map[int32][]int64{},
		finished: map[runner.TP]map[int64]bool{}, attempts: map[runner.TP]map[int64]int{}}
	w.src = &simSource{Source: runnertest.New(), w: w}
	w.src.BatchSize = s.Intn(1, 50)
	return w
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
			Key: fmt.Appendf(nil, "k%d", w.s.Rand.IntN(4)), Value: []byte("v")})
	}
	w.mu.Unlock()
	w.src.Append(recs...)
}

// handler's outcome for an attempt is drawn from the seed, the record and
// the attempt's number; from the fourth attempt on it succeeds.
func (w *groupSim) handler(drain time.Duration) runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		tp := rec.TP()
		w.mu.Lock()
		if w.attempts[tp] == nil {
			w.attempts[tp], w.finished[tp] = map[int64]int{}, map[int64]bool{}
		}
		n := w.attempts[tp][rec.Offset]
		w.attempts[tp][rec.Offset]++
		w.mu.Unlock()
		r := rand.New(rand.NewPCG(w.s.Seed, uint64(rec.Partition)<<48^uint64(rec.Offset)<<8^uint64(n)))
		u := r.Float64()
		if n >= 3 {
			u = 0
		}
		var err error
		switch {
		case u < 0.6:
		case u < 0.75:
			time.Sleep(time.Duration(r.Int64N(int64(20 * time.Millisecond))))
		case u < 0.82:
			// Past the drain budget: it goes on after its ctx ends.
			time.Sleep(drain + time.Duration(r.Int64N(int64(drain))))
		case u < 0.92:
			err = fmt.Errorf("failure of %s", rec.String())
		default:
			panic("simulated panic on " + rec.String())
		}
		if err == nil {
			w.mu.Lock()
			w.finished[tp][rec.Offset] = true
			w.mu.Unlock()
		}
		return err
	}
}

func (w *groupSim) run() {
	t, s := w.s.T, w.s
	for p := range int32(w.parts) {
		w.appendRecs(p, s.Intn(0, 40))
	}
	drain := s.Dur(5*time.Millisecond, 100*time.Millisecond)
	high := s.Intn(1, 60)
	opts := []runner.Option{runner.Handle(topic, w.handler(drain)),
		runner.Order(simtest.Pick(s, runner.KeyOrder, runner.PartitionOrder, runner.Unordered)),
		runner.Concurrency(s.Intn(1, 8)), runner.WaterMarks(high, s.Intn(0, high-1)),
		runner.CommitInterval(s.Dur(time.Millisecond, 20*time.Millisecond)), runner.DrainBudget(drain),
		runner.Backoff(time.Millisecond, 10*time.Millisecond), runner.Logger(slog.New(slog.DiscardHandler))}
	s.Step("%d partitions, batches of %d, drain budget %v", w.parts, w.src.BatchSize, drain)
	r, err := runner.New(w.src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	owned := map[int32]bool{}
	var release func()
	for range s.Intn(5, 30) {
		time.Sleep(s.Dur(0, 50*time.Millisecond))
		p := int32(s.Rand.IntN(w.parts))
		tp := runner.TP{Topic: topic, Partition: p}
		var err error
		switch u := s.Rand.Float64(); {
		case u < 0.3:
			if !s.Step("assign %s (owned %v)", tp, owned[p]) {
				break
			}
			if owned[p] {
				// Assigned again: a new assignment of the same partition.
				s.Fault("re-assign")
				if err = w.src.Revoke(ctx, tp); err == nil {
					err = w.src.Assign(ctx, tp)
				}
			} else {
				err = w.src.Assign(ctx, tp)
			}
			owned[p] = err == nil
		case u < 0.45 && owned[p]:
			if !s.Step("revoke %s", tp) {
				break
			}
			s.Fault("revoke")
			err = w.src.Revoke(ctx, tp)
			owned[p] = false
		case u < 0.55 && owned[p]:
			if !s.Step("lose %s", tp) {
				break
			}
			s.Fault("loss")
			err = w.src.Lose(ctx, tp)
			owned[p] = false
		case u < 0.75:
			n := s.Intn(1, 30)
			if !s.Step("append %d to %s", n, tp) {
				break
			}
			w.appendRecs(p, n)
		case u < 0.85:
			n := s.Intn(1, 3)
			if !s.Step("fail the next %d commits", n) {
				break
			}
			s.Fault("failed commit")
			w.src.FailCommits(n)
		case u < 0.95 && release == nil:
			if !s.Step("hold the commits") {
				break
			}
			s.Fault("held commits")
			_, release = w.src.HoldCommits()
		case release != nil:
			if !s.Step("answer the held commits") {
				break
			}
			release()
			release = nil
		}
		if err != nil {
			// A drain past its budget, a final commit refused: the
			// runner says so, and the schedule goes on.
			s.Step("%s: %v", tp, err)
		}
	}
	if release != nil {
		release()
	}
	s.Step("stop")
	cancel()
	select {
	case <-errc:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its stop")
	}
	// Handlers past their budget finish in the background.
	time.Sleep(3 * drain)
	synctest.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.bad {
		t.Error(b)
	}
	if err := w.src.Violation(); err != nil {
		t.Error(err)
	}
}
