package runner_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/watermark"
)

// TestHandlerMayKeepARecord: the runner keeps its own copy of every record's
// key, value and headers, so the source may reuse its buffers once Fetched
// returned (as a client does with its fetch buffers), and a handler may keep
// a Record after returning: the copy shares nothing with the source's
// buffers, the runner does not reuse it once the record finished (later
// batches come), and appending to a kept record's key or headers reaches
// neither its value nor another record's. (The runner kept the source's
// slices: the handler read bytes the source had overwritten.)
func TestHandlerMayKeepARecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDriver()
		reused := make(chan struct{})
		kept := make(chan runner.Record, 4)
		r := newRunner(t, d, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			if rec.Offset < 4 {
				<-reused
				kept <- rec
			}
			return nil
		}), runner.Order(runner.Unordered), runner.CommitInterval(10*time.Millisecond))
		wait := started(t, r)
		sink := d.sink(t)
		ctx := context.Background()
		if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
			t.Fatal(err)
		}
		buf := []byte("key-0value-0hdr-0hval-0")
		fetch := func(from int64) []runner.Record {
			recs := make([]runner.Record, 4)
			for i := range recs {
				recs[i] = runner.Record{Topic: topic, Offset: from + int64(i), Key: buf[0:5], Value: buf[5:12],
					Headers: []runner.Header{{Key: "h", Value: buf[17:23]}}}
			}
			recs[3].Key, recs[3].Headers = nil, nil // a nil key stays nil
			if _, err := sink.Fetched(ctx, []runner.Batch{batch(recs)}); err != nil {
				t.Fatal(err)
			}
			return recs
		}
		recs := fetch(0)
		copy(buf, bytes.Repeat([]byte("X"), len(buf))) // the source reuses its buffer
		for i := range recs {
			recs[i] = runner.Record{}
		}
		close(reused)
		var got [4]runner.Record
		for range 4 {
			rec := <-kept
			got[rec.Offset] = rec
		}
		// Every record finished: its copy is no longer charged. Later
		// batches must not reuse it.
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if s := r.Stats(); s.Bytes != 0 || s.Buffered != 0 {
			t.Fatalf("stats %+v: want nothing charged once the batch finished", s)
		}
		for from := int64(4); from < 40; from += 4 {
			copy(buf, "KEY-1VALUE-1HDR-1HVAL-1")
			fetch(from)
		}
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		runtime.GC() // the kept records alone keep their copy alive
		got[0].Key = append(got[0].Key, "!!!!!!!!"...)
		got[0].Headers = append(got[0].Headers, runner.Header{Key: "mine"})
		for i, rec := range got[:3] {
			if v, _ := rec.Header("h"); string(rec.Key[:5]) != "key-0" || string(rec.Value) != "value-0" || string(v) != "hval-0" {
				t.Fatalf("record %d kept key %q value %q header %q, want key-0 value-0 hval-0: it shares the source's buffer, was reused, or an append reached it", i, rec.Key, rec.Value, v)
			}
		}
		if rec := got[3]; rec.Key != nil || rec.Headers != nil || string(rec.Value) != "value-0" {
			t.Fatalf("record 3 = key %q (nil %v) value %q headers %v, want a nil key, no headers, value-0", rec.Key, rec.Key == nil, rec.Value, rec.Headers)
		}
		r.Close()
		_ = wait()
	})
}

// liveHeap returns the live heap after a collection.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestIdleRunnerReleasesMemory: once everything is handled and committed,
// what the runner keeps is its per-partition constant, whatever the peak
// was: the tracker ring, the idle key lanes and the free lists shrink. (It
// kept the tracker ring of the peak, idle key lanes up to twice the high
// water mark, and every task of the peak in its free list.)
func TestIdleRunnerReleasesMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const high, low, n = 10_000, 9_000, 50_000
		src := runnertest.New()
		src.BatchSize = 1000
		fill(src, 1, n, n) // every key different: one lane per buffered record
		release := make(chan struct{})
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset < high {
				<-release // build a backlog up to the high water mark
			}
			return nil
		}), runner.WaterMarks(high, low), runner.Concurrency(64), runner.CommitInterval(5*time.Millisecond))
		base := liveHeap()
		started(t, r)
		assign(t, src, tp(0))
		time.Sleep(time.Second)
		synctest.Wait()
		if s := r.Stats(); len(s.Partitions) != 1 || s.Partitions[0].Buffered < high-(high-low)/2 {
			t.Fatalf("no backlog at the high water mark: %+v", s)
		}
		peak := liveHeap() - base
		close(release)
		time.Sleep(time.Second) // fake time: everything runs, then a few ticks
		synctest.Wait()
		if off, _ := src.Committed(tp(0)); off != n {
			t.Fatalf("committed %d, want %d", off, n)
		}
		idle := liveHeap() - base
		limit := int64(runner.PartitionOverhead) + 256<<10 // + 256 KiB of noise
		t.Logf("live heap above the baseline: %d KiB at the backlog, %d KiB idle (limit %d KiB)", peak>>10, idle>>10, limit>>10)
		if idle > limit {
			t.Fatalf("the idle runner holds %d KiB after a peak of %d KiB, above %d KiB", idle>>10, peak>>10, limit>>10)
		}
	})
}

// TestChargeCoversTheHeap: what the runner charges for the records it
// holds (Stats.Bytes, what MaxBufferedBytes bounds) is at least the live
// heap they take, in each ordering mode, with every key different (the
// most lanes). (The runner charged key, value and header bytes only: a
// 23-byte record took about 400 bytes.)
func TestChargeCoversTheHeap(t *testing.T) {
	t.Logf("task %d B, lane %d B; RecordOverhead: key %d B, partition %d B, unordered %d B",
		runner.TaskAllocForTest, runner.LaneAllocForTest, runner.RecordOverhead(runner.KeyOrder),
		runner.RecordOverhead(runner.PartitionOrder), runner.RecordOverhead(runner.Unordered))
	for _, mode := range []runner.Ordering{runner.KeyOrder, runner.PartitionOrder, runner.Unordered} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const high, low, batchSize = 20_000, 10_000, 1000
				d := newDriver()
				hold := make(chan struct{})
				r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
					select {
					case <-hold:
					case <-ctx.Done():
					}
					return nil
				}), runner.Order(mode), runner.Concurrency(1), runner.WaterMarks(high, low),
					runner.ByteWaterMarks(1<<30, 1<<29), runner.MaxBufferedBytes(8<<30), runner.CommitInterval(time.Millisecond))
				wait := started(t, r)
				sink := d.sink(t)
				ctx := context.Background()
				if err := sink.Assigned(ctx, []runner.Assignment{{TP: tp(0), Start: 0}}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				base := liveHeap()
				var off int64
				for budget := batchSize; !d.isPaused(tp(0)); {
					recs := make([]runner.Record, min(budget, batchSize))
					for i := range recs {
						recs[i] = runner.Record{Topic: topic, Offset: off, Key: []byte(fmt.Sprintf("k%06d", off)), Value: make([]byte, 16)}
						if off%2 == 0 {
							recs[i].Headers = []runner.Header{{Key: "h", Value: []byte("hval")}}
						}
						off++
					}
					var err error
					if budget, err = sink.Fetched(ctx, []runner.Batch{batch(recs)}); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(10 * time.Millisecond) // fake time: a tick refreshes Stats
				synctest.Wait()
				held := liveHeap() - base
				s := r.Stats()
				t.Logf("%d records held: %d bytes charged, %d bytes of live heap (%.0f and %.0f per record)",
					s.Buffered, s.Bytes, held, float64(s.Bytes)/float64(s.Buffered), float64(held)/float64(s.Buffered))
				if s.Buffered < high/2 {
					t.Fatalf("only %d records held", s.Buffered)
				}
				if held > s.Bytes {
					t.Fatalf("the records take %d bytes of heap, above the %d charged", held, s.Bytes)
				}
				close(hold)
				r.Close()
				_ = wait()
			})
		})
	}
}

// TestPartitionOverhead: what an owned partition costs without records is
// within PartitionOverhead.
func TestPartitionOverhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 2000
		d := newDriver()
		r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
			runner.CommitInterval(time.Millisecond))
		wait := started(t, r)
		sink := d.sink(t)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		as := make([]runner.Assignment, n)
		for i := range as {
			as[i] = runner.Assignment{TP: tp(int32(i)), Start: 0}
		}
		base := liveHeap()
		if err := sink.Assigned(context.Background(), as); err != nil {
			t.Fatal(err)
		}
		// A few records each: the tracker's least ring; the records' idle
		// key lanes are given back within two ticks.
		for i := range as {
			if _, err := sink.Fetched(context.Background(), []runner.Batch{batch(records(int32(i), 0, 8, 8))}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond) // a tick: the stats snapshot
		synctest.Wait()
		as = nil
		per := (liveHeap() - base) / n
		t.Logf("%d bytes per owned partition (PartitionOverhead %d)", per, runner.PartitionOverhead)
		if per > runner.PartitionOverhead {
			t.Fatalf("an owned partition takes %d bytes, above PartitionOverhead (%d)", per, runner.PartitionOverhead)
		}
		tps := make([]runner.TP, n)
		for i := range tps {
			tps[i] = tp(int32(i))
		}
		if err := sink.Lost(context.Background(), tps); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		tps = nil
		gone := (liveHeap() - base) / n
		t.Logf("%d bytes per partition lost", gone)
		if gone > runner.PartitionGoneOverhead {
			t.Fatalf("a lost partition keeps %d bytes, above PartitionGoneOverhead (%d)", gone, runner.PartitionGoneOverhead)
		}
		r.Close()
		_ = wait()
	})
}

// TestFreeListsLiveUnderTheLimit: the free lists keep tasks and lanes only
// in the room the records leave under the runner's global limit, so
// records and free lists together stay within the runner's share; and a
// tick gives back what nobody took from them since the last one.
func TestFreeListsLiveUnderTheLimit(t *testing.T) {
	d := newDriver()
	r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
		runner.WaterMarks(2000, 1000), runner.ByteWaterMarks(1<<20, 1<<19), runner.MaxBufferedBytes(8<<20))
	tps := make([]runner.TP, 8)
	for i := range tps {
		tps[i] = tp(int32(i))
	}
	runner.AssignForTest(r, tps)
	next := make([]int64, len(tps))
	check := func(when string) {
		t.Helper()
		// After a hand-over the records alone may be above the limit
		// (by less than what one hand-over can add); the free lists then
		// hold nothing.
		charged, free, pauseAt := runner.MemoryForTest(r)
		if charged+free > max(pauseAt, charged) || (charged > pauseAt && free > 0) {
			t.Fatalf("%s: records charged %d and free lists %d, with the global limit %d", when, charged, free, pauseAt)
		}
		if err := runner.CheckLanesForTest(r); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	// Fill to the global limit, empty, refill with other keys, many times.
	for round := range 6 {
		for i := 0; ; i = (i + 1) % len(tps) {
			if d.isPaused(tps[i]) {
				if paused := func() bool {
					for _, tp := range tps {
						if !d.isPaused(tp) {
							return false
						}
					}
					return true
				}(); paused {
					break
				}
				continue
			}
			recs := records(int32(i), next[i], 200, 1<<30)
			for j := range recs {
				recs[j].Value = make([]byte, 1000*(round%3)) // records of other sizes each round
			}
			runner.DeliverForTest(r, batch(recs))
			next[i] += 200
			check("filling")
		}
		for runner.CompleteForTest(r, 1000, func(runner.Record) bool { return false }) > 0 {
			check("emptying")
		}
		if _, free, _ := runner.MemoryForTest(r); round == 0 && free == 0 {
			t.Fatal("the free lists kept nothing: the test does not test them")
		}
	}
	if idle, _ := runner.IdleLanesForTest(r); idle == 0 {
		t.Fatal("no idle lane cached: the test does not test the cache")
	}
	runner.TickForTest(r)
	runner.TickForTest(r) // nothing taken since the last tick: all given back
	if _, free, _ := runner.MemoryForTest(r); free != 0 {
		t.Fatalf("the free lists hold %d bytes after two idle ticks, want 0", free)
	}
	if idle, lanes := runner.IdleLanesForTest(r); idle != 0 || lanes != 0 {
		t.Fatalf("%d idle lanes cached, %d lanes in the maps, after two idle ticks: want none", idle, lanes)
	}
	if err := runner.CheckLanesForTest(r); err != nil {
		t.Fatal(err)
	}
}

// TestRingGrowthStaysWithinTheShare: the runner charges each partition's
// tracker ring at its size, and one hand-over can double every ring it
// brings records to (a ring grows only when full, by doubling). The global
// limit leaves room for that, so the charge stays within the runner's
// share (MaxBufferedBytes less SourceShare) after every hand-over of a
// source that keeps to the pauses, even when the rings are most of it:
// here every partition holds one stuck record and a full ring of finished
// records behind it, and the last hand-over brings one record to each.
func TestRingGrowthStaysWithinTheShare(t *testing.T) {
	const maxBytes, ring = 8 << 20, 8192 // a ring of 8,192 slots: 128 KiB
	share := int64(maxBytes - maxBytes*runner.SourceShare)
	d := newDriver()
	r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
		runner.Order(runner.Unordered), runner.WaterMarks(200, 100), runner.Window(2*ring),
		runner.ByteWaterMarks(1<<20, 1<<19), runner.MaxBufferedBytes(maxBytes))
	// As many partitions as fit under the limit with their rings charged
	// once, and more than fit in the share with them doubled.
	_, _, pauseAt := runner.MemoryForTest(r)
	perPart := int64(ring*watermark.SlotSize - watermark.MinRingBytes + 1024) // its ring, its stuck record
	parts := int(pauseAt/perPart) - 1
	if int64(parts)*2*(perPart-1024) <= share {
		t.Fatalf("%d partitions with doubled rings fit in the share %d: the test cannot test the limit", parts, share)
	}
	tps := make([]runner.TP, parts)
	for i := range tps {
		tps[i] = tp(int32(i))
	}
	runner.AssignForTest(r, tps)
	stuck := func(rec runner.Record) bool { return rec.Offset == 0 }
	handOver := func(bs ...runner.Batch) {
		t.Helper()
		for _, b := range bs {
			runner.DeliverForTest(r, b)
		}
		runner.PublishStatsForTest(r)
		if s := r.Stats(); s.Bytes > share {
			t.Fatalf("after a hand-over the runner charges %d bytes, above its share %d (%d partitions)", s.Bytes, share, parts)
		}
		for runner.CompleteForTest(r, 1000, stuck) > 0 {
		}
	}
	// Fill every ring with one stuck record and finished ones behind it,
	// as a source does: only unpaused partitions, within the budget.
	next := make([]int64, parts)
	for i := range tps {
		for next[i] < ring && !d.isPaused(tps[i]) {
			n := min(int64(runner.BudgetForTest(r)), ring-next[i])
			handOver(batch(records(int32(i), next[i], int(n), 1<<30)))
			next[i] += n
		}
	}
	var last []runner.Batch
	for i := range tps {
		if !d.isPaused(tps[i]) {
			last = append(last, batch(records(int32(i), next[i], 1, 1<<30)))
		}
	}
	if len(last) > 0 {
		handOver(last...)
	}
	if !d.isPaused(tps[0]) {
		t.Fatalf("the rings never reached the global limit: the test does not test it")
	}
}

// TestShrunkRingsResume: a runner paused by the global limit because of
// its tracker rings resumes once the tick shrank them, with nothing else
// happening: the rings are the only thing that fell, and no record is left
// to finish and re-check the limit. (The tick shrank the rings without
// re-checking the limit: the partitions stayed paused for good.)
func TestShrunkRingsResume(t *testing.T) {
	const maxBytes, ring = 8 << 20, 8192
	d := newDriver()
	r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
		runner.Order(runner.Unordered), runner.WaterMarks(200, 100), runner.Window(2*ring),
		runner.ByteWaterMarks(1<<20, 1<<19), runner.MaxBufferedBytes(maxBytes))
	_, _, pauseAt := runner.MemoryForTest(r)
	parts := int(pauseAt / (ring * watermark.SlotSize)) // their rings alone reach the limit
	tps := make([]runner.TP, parts)
	for i := range tps {
		tps[i] = tp(int32(i))
	}
	runner.AssignForTest(r, tps)
	stuck := func(rec runner.Record) bool { return rec.Offset == 0 }
	next := make([]int64, parts)
	for i := range tps {
		for next[i] < ring && !d.isPaused(tps[i]) {
			n := min(int64(runner.BudgetForTest(r)), ring-next[i])
			runner.DeliverForTest(r, batch(records(int32(i), next[i], int(n), 1<<30)))
			next[i] += n
			for runner.CompleteForTest(r, 1000, stuck) > 0 {
			}
		}
	}
	if !d.isPaused(tps[0]) {
		t.Fatalf("the rings never reached the global limit: the test does not test it")
	}
	// Every record finishes: the charge falls to the rings alone, which
	// keep the runner paused until the tick shrinks them.
	for runner.CompleteForTest(r, 1000, func(runner.Record) bool { return false }) > 0 {
	}
	if claimed, _, _ := runner.MemoryForTest(r); claimed <= pauseAt/2 || !d.isPaused(tps[0]) {
		t.Fatalf("with every record finished the claim is %d (paused %v), want above %d and paused: the test does not test the rings",
			claimed, d.isPaused(tps[0]), pauseAt/2)
	}
	runner.TickForTest(r) // the peak was since the last tick: the rings stay
	runner.TickForTest(r) // nothing outstanding since: the least rings
	claimed, _, _ := runner.MemoryForTest(r)
	for _, p := range tps {
		if d.isPaused(p) {
			t.Fatalf("%s still paused after two ticks shrank the rings (claim %d, resume at %d)", p, claimed, pauseAt/2)
		}
	}
}

// TestSteadyKeysAllocateNoLanes: in KeyOrder, a steady workload allocates
// nothing per record beyond its copy, whether its keys come back (a key
// finds its lane idle in the cache, even after the partition emptied in
// between) or never do (a new key takes the lane the oldest idle key
// gave back); and the cache keeps no more idle lanes than records were
// held at once. (Idle lanes were dropped once a partition had more than
// two per record it held: every time a partition emptied, its lanes went
// and its map was rebuilt, and the next records built them again.)
func TestSteadyKeysAllocateNoLanes(t *testing.T) {
	const n, cycles = 500, 30
	for _, tc := range []struct {
		name string
		keys int // distinct keys, 0 for a new key every record
	}{{"keys come back", n}, {"keys never come back", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver()
			r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
				runner.Order(runner.KeyOrder), runner.WaterMarks(2*n, n))
			runner.AssignForTest(r, []runner.TP{tp(0)})
			keys := make([][]byte, n*cycles) // made before: the test allocates nothing per cycle
			for i := range keys {
				keys[i] = []byte(fmt.Sprintf("k%d", i))
			}
			recs := make([]runner.Record, n)
			var off int64
			cycle := func() {
				for i := range recs {
					k := keys[off%int64(len(keys))]
					if tc.keys > 0 {
						k = keys[off%int64(tc.keys)]
					}
					recs[i] = runner.Record{Topic: topic, Offset: off, Key: k} // one allocation to copy: its key
					off++
				}
				runner.DeliverForTest(r, batch(recs))
				if done := runner.CompleteForTest(r, 2*n, func(runner.Record) bool { return false }); done != n {
					t.Fatalf("completed %d of %d", done, n)
				}
			}
			cycle()
			cycle()
			if a := testing.AllocsPerRun(cycles-4, cycle); a > n {
				t.Fatalf("a hand-over of %d records, all finished, allocates %v times, want %d (the records' copies)", n, a, n)
			}
			if err := runner.CheckLanesForTest(r); err != nil {
				t.Fatal(err)
			}
			if idle, lanes := runner.IdleLanesForTest(r); idle != lanes || idle > n {
				t.Fatalf("%d idle lanes cached, %d lanes in all, after hand-overs of %d records: want all idle, at most %d", idle, lanes, n, n)
			}
		})
	}
}

// TestDroppedRecordsFreeTheirLanes: when a revoke drops the records that
// had not started, their key lanes go idle (into the cache, charged in the
// free room) rather than staying busy with no record charged for them.
// (They stayed busy, and uncharged, until the drain ended.)
func TestDroppedRecordsFreeTheirLanes(t *testing.T) {
	d := newDriver()
	r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
		runner.Order(runner.KeyOrder))
	runner.AssignForTest(r, []runner.TP{tp(0), tp(1)})
	for p := range int32(2) {
		runner.DeliverForTest(r, batch(records(p, 0, 100, 1<<30)))
	}
	if n := runner.CompleteForTest(r, 150, func(rec runner.Record) bool { return rec.Partition == 0 }); n != 50 { // 50 of tp(1)'s lanes idle
		t.Fatalf("completed %d records, want 50", n)
	}
	if err := runner.CheckLanesForTest(r); err != nil {
		t.Fatalf("before the revoke: %v", err)
	}
	runner.StopDispatchForTest(r, tp(0))
	if err := runner.CheckLanesForTest(r); err != nil {
		t.Fatalf("after the revoke dropped tp(0)'s records: %v", err)
	}
	if idle, _ := runner.IdleLanesForTest(r); idle != 150 {
		t.Fatalf("%d idle lanes, want 150 (tp(0)'s 100 and 50 of tp(1))", idle)
	}
}

// TestLaneCacheRandom drives KeyOrder's lanes with random hand-overs over
// a few keys (so lanes queue records), completions, revokes and ticks,
// under a global limit that the records reach, and checks the lane
// accounting and that the free room holds after every step.
func TestLaneCacheRandom(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 13))
		d := newDriver()
		r := newRunner(t, d, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
			runner.Order(runner.KeyOrder), runner.WaterMarks(400, 200), runner.ByteWaterMarks(1<<20, 1<<19),
			runner.MaxBufferedBytes(2<<20))
		tps := []runner.TP{tp(0), tp(1), tp(2), tp(3)}
		runner.AssignForTest(r, tps)
		next := make([]int64, len(tps))
		revoked := make([]bool, len(tps))
		nrevoked, reached := 0, false
		for step := range 600 {
			var what string
			switch op := rng.IntN(10); {
			case op < 5:
				i := rng.IntN(len(tps))
				if d.isPaused(tps[i]) || revoked[i] {
					continue
				}
				n := 1 + rng.IntN(min(runner.BudgetForTest(r), 100))
				recs := records(int32(i), next[i], n, 1+rng.IntN(300))
				for j := range recs {
					recs[j].Value = make([]byte, rng.IntN(4000))
				}
				runner.DeliverForTest(r, batch(recs))
				next[i] += int64(n)
				what = fmt.Sprintf("deliver %d to %s", n, tps[i])
			case op < 8:
				n := runner.CompleteForTest(r, rng.IntN(200), func(rec runner.Record) bool { return rng.IntN(4) == 0 })
				what = fmt.Sprintf("complete %d", n)
			case op < 9:
				if i := rng.IntN(len(tps)); !revoked[i] && nrevoked < 2 && rng.IntN(4) == 0 {
					runner.StopDispatchForTest(r, tps[i])
					revoked[i] = true
					nrevoked++
					what = "revoke " + tps[i].String()
				}
			default:
				runner.TickForTest(r)
				what = "tick"
			}
			if err := runner.CheckLanesForTest(r); err != nil {
				t.Fatalf("seed %d, step %d (%s): %v", seed, step, what, err)
			}
			claimed, free, pauseAt := runner.MemoryForTest(r)
			if claimed+free > max(pauseAt, claimed) || (claimed > pauseAt && free > 0) {
				t.Fatalf("seed %d, step %d (%s): claim %d and free room %d, with the global limit %d", seed, step, what, claimed, free, pauseAt)
			}
			reached = reached || claimed >= pauseAt
		}
		if !reached {
			t.Fatalf("seed %d: the claim never reached the global limit: the test does not test it", seed)
		}
		r.Close()
	}
}
