package runner

// Unit tests of the poll goroutine's side of batch handlers, in the style
// of state_test.go: the pure pollState driven event by event, with no
// goroutine, Source, sleep or real clock.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"testing"
	"time"
)

// newBatchHarness is newHarness with stateTopic registered by HandleBatch
// with bopts.
func newBatchHarness(t *testing.T, bopts []HandleOption, opts ...Option) *harness {
	t.Helper()
	base := []Option{
		HandleBatch(stateTopic, func(context.Context, []Record) error { return nil }, bopts...),
		Logger(slog.New(slog.DiscardHandler)),
	}
	r, err := New(noSource{t}, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: &r.poll, clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.s.now = func() time.Time { return h.clock }
	return h
}

// bgot is got with the linger timer the event and its settle set (zero:
// unchanged).
type bgot struct {
	got
	lingerAt time.Time
}

// doB is harness.do keeping the linger timer of the event and of the
// settle after it.
func (h *harness) doB(a *actions) bgot {
	h.t.Helper()
	at := a.lingerAt
	g := got{
		replies: slices.Clone(a.replies), commit: a.commit, work: tasksOf(a.work),
		pause: slices.Clone(a.pause), resume: slices.Clone(a.resume), answer: a.answer, drainAt: a.drainAt,
	}
	a.reset()
	st := h.s.settle()
	if len(st.replies) > 0 || st.commit != nil || st.answer.to != nil || st.answer.toErr != nil || !st.drainAt.IsZero() {
		h.t.Fatalf("settle returned more than work, flow and the linger timer: %+v", st)
	}
	if !st.lingerAt.IsZero() && (at.IsZero() || st.lingerAt.Before(at)) {
		at = st.lingerAt
	}
	g.work = append(g.work, tasksOf(st.work)...)
	g.pause = append(g.pause, st.pause...)
	g.resume = append(g.resume, st.resume...)
	st.reset()
	if len(st.settlements)+len(st.replies)+len(st.pause)+len(st.resume)+st.work.n > 0 || st.commit != nil ||
		st.answer != (reply{}) || !st.drainAt.IsZero() || !st.lingerAt.IsZero() {
		h.t.Fatalf("reset left actions behind: %+v", *st)
	}
	return bgot{got: g, lingerAt: at}
}

// fetchKeyed hands over tp's records at offsets with the keys given (nil
// for none).
func (h *harness) fetchKeyed(tp TP, offsets []int64, keys []string) bgot {
	h.t.Helper()
	b := Batch{TP: tp, Position: -1, HighWatermark: -1}
	for i, off := range offsets {
		rec := Record{Topic: tp.Topic, Partition: tp.Partition, Offset: off, Value: []byte("v")}
		if keys != nil {
			rec.Key = []byte(keys[i])
		}
		b.Records = append(b.Records, rec)
	}
	req := &sinkReq{kind: sinkFetched, batches: []Batch{b}, reply: make(chan sinkReply, 1)}
	g := h.doB(h.s.reported(req))
	if _, ok := g.answered(req.reply); !ok {
		h.t.Fatalf("Fetched not answered: %+v", g)
	}
	return g
}

// batchesOf returns the batches of the dispatched work, failing on a
// single record.
func batchesOf(t *testing.T, work []*task) []*batch {
	t.Helper()
	var bs []*batch
	for _, tk := range work {
		if tk.batch == nil {
			t.Fatalf("single record %s dispatched for a batch route", tk.rec.String())
		}
		bs = append(bs, tk.batch)
	}
	return bs
}

func offsetsIn(b *batch) []int64 {
	var offs []int64
	for _, r := range b.recs {
		offs = append(offs, r.Offset)
	}
	return offs
}

// finishBatch hands back b as a worker does after its handler succeeded.
func (h *harness) finishBatch(b *batch) bgot {
	for _, t := range b.tasks {
		t.res = resHandled
	}
	b.from = len(b.tasks)
	lead := b.tasks[0]
	lead.nextQ = nil
	return h.doB(h.s.tasksFinished(lead))
}

func seq(from, n int64) []int64 {
	var s []int64
	for i := range n {
		s = append(s, from+i)
	}
	return s
}

// TestBatchSizeBoundAndOnePartition: in every ordering, no batch holds
// more than BatchSize records or records of two partitions, each holds its
// records in offset order with the handler's copy matching its tasks, and
// together the batches hold every record once.
func TestBatchSizeBoundAndOnePartition(t *testing.T) {
	for _, o := range []Ordering{KeyOrder, PartitionOrder, Unordered} {
		t.Run(o.String(), func(t *testing.T) {
			h := newBatchHarness(t, []HandleOption{BatchSize(4)}, Order(o))
			h.assign(0, stp(0), stp(1))
			keys := func(n int) []string {
				var ks []string
				for i := range n {
					ks = append(ks, fmt.Sprintf("k%d", i%3))
				}
				return ks
			}
			work := h.fetchKeyed(stp(0), seq(0, 10), keys(10)).work
			work = append(work, h.fetchKeyed(stp(1), seq(0, 7), keys(7)).work...)
			seen := map[TP][]int64{}
			for len(work) > 0 {
				var next []*task
				for _, b := range batchesOf(t, work) {
					if n := len(b.recs); n == 0 || n > 4 || n != len(b.tasks) {
						t.Fatalf("a batch of %d records (%d tasks), want 1 to 4", n, len(b.tasks))
					}
					for i, rec := range b.recs {
						if rec.TP() != b.ps.tp || b.tasks[i].ps != b.ps || b.tasks[i].rec.Offset != rec.Offset {
							t.Fatalf("batch of %s holds %s (task %s)", b.ps.tp, rec.String(), b.tasks[i].rec.String())
						}
					}
					if offs := offsetsIn(b); !slices.IsSorted(offs) {
						t.Fatalf("batch %v not in offset order", offs)
					}
					seen[b.ps.tp] = append(seen[b.ps.tp], offsetsIn(b)...)
					next = append(next, h.finishBatch(b).work...)
				}
				work = next
			}
			for tp, n := range map[TP]int64{stp(0): 10, stp(1): 7} {
				got := slices.Clone(seen[tp])
				slices.Sort(got)
				if !slices.Equal(got, seq(0, n)) {
					t.Fatalf("%s: batches held %v, want each of 0..%d once", tp, seen[tp], n-1)
				}
			}
		})
	}
}

// TestBatchKeyOrder: under KeyOrder a batch takes several records of one
// key (a hot key gets full batches) and records of other keys; while it is
// in flight no other record of its keys is dispatched; a key's records run
// in offset order across batches.
func TestBatchKeyOrder(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(4)})
	tp := stp(0)
	h.assign(0, tp)
	// Offsets 0..9 of the hot key h, then 10 of key c, 11 of h.
	keys := []string{"h", "h", "h", "h", "h", "h", "h", "h", "h", "h", "c", "h"}
	work := h.fetchKeyed(tp, seq(0, 12), keys).work
	bs := batchesOf(t, work)
	// h's lane was ready first: the first batch is four of its records;
	// the rest of h waits behind it, so the only other batch is c's.
	if len(bs) != 2 || !slices.Equal(offsetsIn(bs[0]), []int64{0, 1, 2, 3}) || !slices.Equal(offsetsIn(bs[1]), []int64{10}) {
		var got [][]int64
		for _, b := range bs {
			got = append(got, offsetsIn(b))
		}
		t.Fatalf("batches %v, want [[0 1 2 3] [10]]", got)
	}
	// c's batch returning releases nothing of h.
	if g := h.finishBatch(bs[1]); len(g.work) > 0 {
		t.Fatalf("dispatched %v while h's batch is in flight", offsetsIn(batchesOf(t, g.work)[0]))
	}
	// More records of h and c arrive: c goes on, h still waits.
	g := h.fetchKeyed(tp, []int64{12, 13}, []string{"c", "h"})
	if bs := batchesOf(t, g.work); len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), []int64{12}) {
		t.Fatalf("the fetch dispatched %d batches, want c's [12] alone", len(bs))
	}
	// h's batch returns: its next four, in offset order.
	last := int64(3)
	b := bs[0]
	for {
		g := h.finishBatch(b)
		bs := batchesOf(t, g.work)
		if len(bs) == 0 {
			break
		}
		if len(bs) != 1 {
			t.Fatalf("%d batches of one key dispatched at once", len(bs))
		}
		b = bs[0]
		offs := offsetsIn(b)
		if offs[0] <= last || !slices.IsSorted(offs) {
			t.Fatalf("h's batch %v after %d", offs, last)
		}
		if offs[0] == 4 && len(offs) != 4 {
			t.Fatalf("h's second batch %v, want a full batch of 4", offs)
		}
		last = offs[len(offs)-1]
	}
	if last != 13 {
		t.Fatalf("h's last record run was %d, want 13", last)
	}
}

// TestBatchPartitionOrder: under PartitionOrder a batch is consecutive
// records and the next waits for it.
func TestBatchPartitionOrder(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(3)}, Order(PartitionOrder))
	tp := stp(0)
	h.assign(0, tp)
	bs := batchesOf(t, h.fetchKeyed(tp, seq(0, 7), []string{"a", "b", "c", "a", "b", "c", "a"}).work)
	for want := int64(0); want < 7; want += 3 {
		if len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), seq(want, min(3, 7-want))) {
			t.Fatalf("dispatched %d batches (first %v), want one: %v", len(bs), offsetsIn(bs[0]), seq(want, min(3, 7-want)))
		}
		bs = batchesOf(t, h.finishBatch(bs[0]).work)
	}
	if len(bs) != 0 {
		t.Fatal("a batch after the last record")
	}
}

// TestBatchLinger: a batch is due when BatchSize records are ready or the
// first has waited BatchWait, on the linger timer (actions.lingerAt), not
// before; with BatchWait 0 what is ready goes at once.
func TestBatchLinger(t *testing.T) {
	tp := stp(0)
	t.Run("wait", func(t *testing.T) {
		h := newBatchHarness(t, []HandleOption{BatchSize(5), BatchWait(10 * time.Millisecond)})
		h.assign(0, tp)
		start := h.clock
		g := h.fetchKeyed(tp, seq(0, 2), nil)
		if len(g.work) > 0 {
			t.Fatalf("2 of 5 records dispatched at once with a BatchWait")
		}
		if want := start.Add(10 * time.Millisecond); !g.lingerAt.Equal(want) {
			t.Fatalf("linger timer at %v, want %v", g.lingerAt, want)
		}
		h.clock = h.clock.Add(4 * time.Millisecond)
		if g := h.fetchKeyed(tp, seq(2, 1), nil); len(g.work) > 0 || !g.lingerAt.IsZero() {
			t.Fatalf("a third record dispatched %d or moved the timer to %v: the first's wait counts", len(g.work), g.lingerAt)
		}
		h.clock = start.Add(10*time.Millisecond - 1)
		if g := h.doB(h.s.lingerFired()); len(g.work) > 0 {
			t.Fatal("dispatched before the first record waited BatchWait")
		}
		h.clock = start.Add(10 * time.Millisecond)
		bs := batchesOf(t, h.doB(h.s.lingerFired()).work)
		if len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), seq(0, 3)) {
			t.Fatalf("after BatchWait: %d batches, want one of 0..2", len(bs))
		}
	})
	t.Run("full", func(t *testing.T) {
		h := newBatchHarness(t, []HandleOption{BatchSize(5), BatchWait(time.Hour)})
		h.assign(0, tp)
		h.fetchKeyed(tp, seq(0, 3), nil)
		bs := batchesOf(t, h.fetchKeyed(tp, seq(3, 4), nil).work)
		if len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), seq(0, 5)) {
			t.Fatalf("5 ready records: %d batches, want one of 0..4 at once", len(bs))
		}
		// The two left keep their wait: the first became ready at the
		// start, and is due an hour after it.
		h.clock = h.clock.Add(time.Hour)
		bs = batchesOf(t, h.doB(h.s.lingerFired()).work)
		if len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), seq(5, 2)) {
			t.Fatalf("after BatchWait: %d batches, want one of 5..6", len(bs))
		}
	})
	t.Run("zero", func(t *testing.T) {
		h := newBatchHarness(t, []HandleOption{BatchSize(5)})
		h.assign(0, tp)
		g := h.fetchKeyed(tp, seq(0, 2), nil)
		if bs := batchesOf(t, g.work); len(bs) != 1 || len(bs[0].recs) != 2 || !g.lingerAt.IsZero() {
			t.Fatalf("BatchWait 0: %d batches, timer %v; want the 2 ready records at once", len(bs), g.lingerAt)
		}
	})
}

// TestBatchCountsOnceAgainstConcurrency: a batch of many records is one
// handler call: Concurrency(2) runs two batches at once, not two records.
func TestBatchCountsOnceAgainstConcurrency(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(10)}, Concurrency(2))
	h.assign(0, stp(0), stp(1), stp(2))
	var bs []*batch
	for p := range int32(3) {
		bs = append(bs, batchesOf(t, h.fetchKeyed(stp(p), seq(0, 10), nil).work)...)
	}
	if len(bs) != 2 {
		t.Fatalf("%d batches in flight with Concurrency(2), want 2", len(bs))
	}
	if got := h.s.snapshot(nil).InFlight; got != 20 {
		t.Fatalf("Stats.InFlight %d, want the 20 records of the two batches", got)
	}
	next := batchesOf(t, h.finishBatch(bs[0]).work)
	if len(next) != 1 || next[0].ps.tp != stp(2) {
		t.Fatal("the third partition's batch not dispatched once a worker was free")
	}
}

// TestBatchInFlightHoldsTheCommit: the commit does not pass a record of a
// batch in flight, also when later records finished; it passes the whole
// batch once it returns.
func TestBatchInFlightHoldsTheCommit(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(4)}, Order(Unordered))
	tp := stp(0)
	h.assign(0, tp)
	bs := batchesOf(t, h.fetchKeyed(tp, seq(0, 6), nil).work)
	if len(bs) != 2 {
		t.Fatalf("%d batches, want [0..3] and [4 5]", len(bs))
	}
	h.finishBatch(bs[1]) // 4 and 5 finished, behind the batch in flight
	if c := h.tick().commit; c != nil {
		t.Fatalf("committed %v with the batch of 0..3 in flight", c.offsets)
	}
	h.finishBatch(bs[0])
	if want := []Offset{{TP: tp, Offset: 6}}; !slices.Equal(offsetsOf(h.tick().commit), want) {
		t.Fatalf("after the batch returned, want commit %v", want)
	}
}

// TestBatchRevokeWaitsForABatch: a revoke drains a batch in flight: no
// final commit and no answer until it returns (or the budget ends); the
// records not yet in a batch are dropped.
func TestBatchRevokeWaitsForABatch(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(3)}, Order(PartitionOrder), DrainBudget(10*time.Second))
	tp := stp(0)
	h.assign(0, tp)
	bs := batchesOf(t, h.fetchKeyed(tp, seq(0, 5), nil).work)
	g, reply := h.revoke(time.Time{}, tp)
	if _, ok := g.revokeAnswered(reply); ok || g.commit != nil {
		t.Fatalf("Revoked with a batch in flight: answered %v, commit %v", ok, offsetsOf(g.commit))
	}
	if h.s.parts[tp].count != 3 {
		t.Fatalf("%d records held while draining, want the batch's 3 (3 and 4 dropped)", h.s.parts[tp].count)
	}
	h.clock = h.clock.Add(5 * time.Second)
	if g := h.do(h.s.drainDue()); g.commit != nil {
		t.Fatal("committed before the batch returned and within the budget")
	}
	g = h.finishBatch(bs[0]).got
	if len(g.work) > 0 {
		t.Fatal("a batch dispatched for a revoking partition")
	}
	if want := []Offset{{TP: tp, Offset: 3}}; !slices.Equal(offsetsOf(g.commit), want) {
		t.Fatalf("final commit %v, want %v", offsetsOf(g.commit), want)
	}
	err, ok := h.answer(g.commit, nil).revokeAnswered(reply)
	if !ok || err != nil {
		t.Fatalf("Revoked answered %v with %v, want answered with nil", ok, err)
	}
}

// TestBatchLostCancelsItsContext: losing the partition cancels the ctx a
// batch in flight runs under, and its return commits nothing.
func TestBatchLostCancelsItsContext(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(3)})
	tp := stp(0)
	h.assign(0, tp)
	b := batchesOf(t, h.fetchKeyed(tp, seq(0, 3), nil).work)[0]
	if b.ps.ctx.Err() != nil {
		t.Fatal("the batch's ctx ended before the loss")
	}
	h.lost(tp)
	if !errors.Is(b.ps.ctx.Err(), context.Canceled) {
		t.Fatalf("after Lost the batch's ctx has %v, want Canceled", b.ps.ctx.Err())
	}
	for _, tk := range b.tasks {
		tk.res = resCancelled
	}
	lead := b.tasks[0]
	lead.nextQ = nil
	if g := h.do(h.s.tasksFinished(lead)); g.commit != nil {
		t.Fatalf("the lost partition's batch committed %v", g.commit.offsets)
	}
	if c := h.tick().commit; c != nil {
		t.Fatalf("tick committed %v for a lost partition", c.offsets)
	}
	if h.s.totalCount != 0 || h.s.totalBytes != 0 || h.s.inflight != 0 || h.s.batchExtra != 0 {
		t.Fatalf("after the lost batch returned: %d records, %d bytes, %d in flight (%d extra) left", h.s.totalCount, h.s.totalBytes, h.s.inflight, h.s.batchExtra)
	}
}

// TestBatchFencedHoldsItsLanes: a batch whose records were fenced holds
// their keys' lanes, so a later record of those keys never runs in this
// assignment, while the records before the fence complete.
func TestBatchFencedHoldsItsLanes(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(2)})
	tp := stp(0)
	h.assign(0, tp)
	b := batchesOf(t, h.fetchKeyed(tp, seq(0, 2), []string{"a", "b"}).work)[0]
	b.tasks[0].res = resHandled // a's record applied, b's fenced (a BatchError at 1)
	b.tasks[1].res = resFenced
	lead := b.tasks[0]
	lead.nextQ = nil
	h.do(h.s.tasksFinished(lead))
	bs := batchesOf(t, h.fetchKeyed(tp, []int64{2, 3}, []string{"a", "b"}).work)
	if len(bs) != 1 || !slices.Equal(offsetsIn(bs[0]), []int64{2}) {
		t.Fatalf("after the fence, want a's record 2 alone to run, b's 3 held")
	}
	if want := []Offset{{TP: tp, Offset: 1}}; !slices.Equal(offsetsOf(h.tick().commit), want) {
		t.Fatalf("want commit %v: the fenced record holds it", want)
	}
	if err := CheckLanesForTest(&Runner{poll: *h.s}); err != nil {
		t.Fatal(err)
	}
}

// TestBatchChargeCoversItsAllocations: what forming a batch allocates (the
// batch, its slices of tasks, records and lanes) is within what its
// records are charged for it, batchRecordOverhead each, for any size, in
// the ordering that allocates most (KeyOrder, a lane per record).
func TestBatchChargeCoversItsAllocations(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 10, 33, 100, 293, 500, 1000} {
		// TotalAlloc counts every goroutine's allocations (a test's
		// leftovers, the race detector's): they only add, so the least of
		// a few measurements is the batch's.
		least := int64(-1)
		for range 5 {
			if got := batchAllocation(t, n); least < 0 || got < least {
				least = got
			}
		}
		if charged := int64(n) * batchRecordOverhead; least > charged {
			t.Errorf("a batch of %d allocated %d bytes, its records are charged %d for it", n, least, charged)
		}
	}
}

// batchAllocation returns the bytes allocated while forming one batch of n
// records of n keys.
func batchAllocation(t *testing.T, n int) int64 {
	h := newBatchHarness(t, []HandleOption{BatchSize(n), BatchWait(time.Hour)})
	tp := stp(0)
	h.assign(0, tp)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	// n-1 records linger; the n-th makes the batch due: take it by hand.
	h.fetchKeyed(tp, seq(0, int64(n-1)), keys[:n-1])
	ps := h.s.parts[tp]
	ps.batch.queued = true // keep the fetch below from dispatching it
	h.fetchKeyed(tp, []int64{int64(n - 1)}, keys[n-1:])
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b := h.s.take(ps).batch
	runtime.ReadMemStats(&after)
	if len(b.tasks) != n || len(b.lanes) != n {
		t.Fatalf("n=%d: a batch of %d records and %d lanes", n, len(b.tasks), len(b.lanes))
	}
	return int64(after.TotalAlloc - before.TotalAlloc)
}

// TestBatchRevokeBudgetRunsOut: a batch still running when the revoke's
// budget ends has its ctx cancelled; the final commit stops before it and
// the revoke reports it unfinished.
func TestBatchRevokeBudgetRunsOut(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(3)}, DrainBudget(10*time.Second))
	tp := stp(0)
	h.assign(0, tp)
	h.finishBatch(batchesOf(t, h.fetchKeyed(tp, seq(0, 1), nil).work)[0]) // 0 done: the safe offset is 1
	b := batchesOf(t, h.fetchKeyed(tp, seq(1, 3), nil).work)[0]
	_, reply := h.revoke(time.Time{}, tp)
	h.clock = h.clock.Add(10 * time.Second)
	g := h.do(h.s.drainDue())
	if want := []Offset{{TP: tp, Offset: 1}}; !slices.Equal(offsetsOf(g.commit), want) {
		t.Fatalf("final commit %v, want %v", offsetsOf(g.commit), want)
	}
	err, _ := h.answer(g.commit, nil).revokeAnswered(reply)
	var de *DrainError
	if !errors.As(err, &de) || de.Unfinished[tp] != 1 {
		t.Fatalf("Revoked returned %v, want a DrainError with %s unfinished at 1", err, tp)
	}
	if !errors.Is(b.ps.ctx.Err(), context.Canceled) {
		t.Fatalf("the batch's ctx has %v after the budget, want Canceled", b.ps.ctx.Err())
	}
}

// TestBatchOfAnOldEpochCommitsNothing: a batch of an assignment that was
// lost returns after the partition was assigned again: it moves nothing of
// the new assignment, whose own batch then commits.
func TestBatchOfAnOldEpochCommitsNothing(t *testing.T) {
	h := newBatchHarness(t, []HandleOption{BatchSize(3)})
	tp := stp(0)
	h.assign(0, tp)
	old := batchesOf(t, h.fetchKeyed(tp, seq(0, 3), nil).work)[0]
	h.lost(tp)
	h.assign(0, tp)
	cur := batchesOf(t, h.fetchKeyed(tp, seq(0, 3), nil).work)[0]
	if g := h.finishBatch(old); g.commit != nil {
		t.Fatalf("the old batch committed %v", g.commit.offsets)
	}
	if c := h.tick().commit; c != nil {
		t.Fatalf("after the old batch returned, tick committed %v", c.offsets)
	}
	h.finishBatch(cur)
	if want := []Offset{{TP: tp, Offset: 3}}; !slices.Equal(offsetsOf(h.tick().commit), want) {
		t.Fatalf("want commit %v from the new assignment's batch", want)
	}
}
