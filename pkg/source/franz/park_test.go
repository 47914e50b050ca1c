package franz_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// TestParkedRecordsOwnTheirMemory: records the source keeps for a paused
// partition beyond the poll they came from share no memory with that poll's
// buffers, and the poll's reusable record buffers keep nothing of it, so
// that nothing of a fetch stays alive once the runner copied what it was
// handed (before: one parked record pinned a whole fetch response).
// Keys, values and headers are kept exactly, nil and empty alike.
func TestParkedRecordsOwnTheirMemory(t *testing.T) {
	t.Parallel()
	src := benchSourceT(t)
	// One "fetch response": every key and value slices into it.
	fetch := bytes.Repeat([]byte("0123456789"), 100)
	tp := runner.TP{Topic: "t", Partition: 0}
	var recs []runner.Record
	for i := range 20 {
		r := runner.Record{Topic: "t", Offset: int64(i), Key: fetch[i*10 : i*10+5], Value: fetch[i*10+5 : i*10+10]}
		switch i {
		case 3:
			r.Key = nil
		case 4:
			r.Value = fetch[:0]
		case 5:
			r.Headers = []runner.Header{{Key: "h", Value: fetch[500:510]}, {Key: "n"}}
		}
		recs = append(recs, r)
	}
	want := slices.Clone(recs)
	parked, pinned := src.Park([]runner.Batch{{TP: tp, Records: recs, Position: 20, HighWatermark: 20}})
	got := parked[tp]
	if len(got) != len(want) {
		t.Fatalf("parked %d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		w := want[i]
		if fmt.Sprint(r) != fmt.Sprint(w) || (r.Key == nil) != (w.Key == nil) || (r.Value == nil) != (w.Value == nil) {
			t.Fatalf("parked record %d is %+v, want %+v", i, r, w)
		}
		if overlaps(r.Key, fetch) || overlaps(r.Value, fetch) {
			t.Fatalf("parked record %d's key or value points into the fetch's buffer", i)
		}
		for _, h := range r.Headers {
			if overlaps(h.Value, fetch) {
				t.Fatalf("parked record %d's header %q points into the fetch's buffer", i, h.Key)
			}
		}
	}
	if pinned > 0 {
		t.Fatalf("the reusable record buffers still hold %d records of the parked poll", pinned)
	}
}

// TestParkedBytesBounded: the records the source keeps for partitions the
// runner paused after it took them from the client are bounded in bytes;
// what does not fit is dropped and fetched again once the partition is
// resumed, so every record still arrives once, in order, with the position
// after the last.
func TestParkedBytesBounded(t *testing.T) {
	t.Parallel()
	const per = 400
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	produce(c, "t", 2, per, 10) // before the start: the first poll takes them all
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	// About 40 of these records fit: fewer than partition 0 leaves held
	// when it is paused after its first hand-over of 5.
	sample := runner.Record{Topic: "t", Key: []byte("k0-0"), Value: []byte("100"), Headers: []runner.Header{{Key: "i", Value: []byte("100")}}}
	limit := 40 * franz.ParkedSize([]runner.Record{sample})
	src.SetParkLimit(limit)
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	sink := &pauseSink{chanSink: chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 10000)},
		src: src, tp: p0}
	runSource(t, src, sink)
	got := map[runner.TP][]int64{}
	last := map[runner.TP]int64{}
	var most int64
	take := func(d time.Duration, until func() bool) {
		timer := time.NewTimer(d)
		defer timer.Stop()
		for !until() {
			most = max(most, src.ParkedBytes())
			select {
			case b := <-sink.batches:
				for _, r := range b.Records {
					got[b.TP] = append(got[b.TP], r.Offset)
				}
				if b.Position >= 0 {
					last[b.TP] = b.Position
				}
			case <-time.After(5 * time.Millisecond):
			case <-timer.C:
				return
			}
		}
	}
	take(15*time.Second, func() bool { return len(got[p1]) == per })
	take(1500*time.Millisecond, func() bool { return false }) // while partition 0 is paused
	if len(got[p1]) != per || len(got[p0]) == 0 || len(got[p0]) > 5 {
		t.Fatalf("before the resume: partition 1 got %d records (want %d), partition 0 %d (want 1 to 5)", len(got[p1]), per, len(got[p0]))
	}
	src.Resume([]runner.TP{p0})
	take(10*time.Second, func() bool { return len(got[p0]) >= per })
	take(500*time.Millisecond, func() bool { return false })
	t.Logf("parked at most %d bytes (limit %d)", most, limit)
	if most > limit {
		t.Fatalf("parked records took %d bytes, above the limit %d", most, limit)
	}
	for _, tp := range []runner.TP{p0, p1} {
		if len(got[tp]) != per {
			t.Errorf("%s got %d records, want %d", tp, len(got[tp]), per)
		}
		for i, o := range got[tp] {
			if o != int64(i) {
				t.Fatalf("%s: record %d has offset %d: lost, repeated or out of order", tp, i, o)
			}
		}
		if last[tp] != per {
			t.Errorf("%s: last position %d, want %d", tp, last[tp], per)
		}
	}
}
