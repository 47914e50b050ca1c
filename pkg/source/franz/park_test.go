package franz_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"github.com/tidemark/tidemark/pkg/runner"
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
// handed (issue 13 §1: one parked record pinned a whole fetch response).
// Keys, values and headers are kept exactly, nil and empty alike.
func TestParkedRecordsOwnTheirMemory(t *testing.T) {
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
