package watermark_test

import (
	"errors"
	"math"
	"runtime"
	"testing"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// op is one step of a table test: exactly one of its kinds is set.
type op struct {
	deliver  []int64 // Deliver each; all must succeed
	complete int64   // Complete, want outcome
	position int64   // Position, want moved
	kind     byte    // 'd', 'c' or 'p'
	outcome  watermark.Outcome
	moved    bool
	safe     int64 // Safe() after the step
}

func deliver(safe int64, offs ...int64) op { return op{kind: 'd', deliver: offs, safe: safe} }
func complete(off int64, o watermark.Outcome, safe int64) op {
	return op{kind: 'c', complete: off, outcome: o, safe: safe}
}
func position(pos int64, moved bool, safe int64) op {
	return op{kind: 'p', position: pos, moved: moved, safe: safe}
}

func TestTrackerOutcomes(t *testing.T) {
	tests := []struct {
		name  string
		start int64
		ops   []op
	}{
		{"sparse trace of the seed: 108, 100, 103", 100, []op{
			deliver(100, 100, 103, 108),
			complete(108, watermark.Recorded, 100),
			complete(100, watermark.Advanced, 101),
			complete(103, watermark.Advanced, 109),
		}},
		{"invariant 1: 100 and 103 complete, 108 not", 100, []op{
			deliver(100, 100, 103, 108),
			complete(100, watermark.Advanced, 101),
			complete(103, watermark.Advanced, 104),
			complete(108, watermark.Advanced, 109),
		}},
		{"first delivered above the start waits for it", 100, []op{
			deliver(100, 103),
			complete(103, watermark.Advanced, 104),
		}},
		{"duplicate below the safe offset", 100, []op{
			deliver(100, 100, 101),
			complete(100, watermark.Advanced, 101),
			complete(100, watermark.Duplicate, 101),
			complete(99, watermark.Duplicate, 101),
		}},
		{"duplicate of a completed record behind an unfinished one", 100, []op{
			deliver(100, 100, 101),
			complete(101, watermark.Recorded, 100),
			complete(101, watermark.Duplicate, 100),
		}},
		{"undelivered integer in a gap is unknown", 100, []op{
			deliver(100, 100, 103),
			complete(101, watermark.UnknownOffset, 100),
			complete(102, watermark.UnknownOffset, 100),
		}},
		{"gap below the first delivered offset is unknown", 100, []op{
			deliver(100, 105),
			complete(100, watermark.UnknownOffset, 100),
		}},
		{"beyond the last delivered is unknown", 100, []op{
			deliver(100, 100),
			complete(101, watermark.UnknownOffset, 100),
		}},
		{"nothing delivered is unknown", 100, []op{
			complete(100, watermark.UnknownOffset, 100),
		}},
		{"an integer in a gap already passed is a duplicate", 100, []op{
			deliver(100, 100, 103),
			complete(100, watermark.Advanced, 101),
			complete(103, watermark.Advanced, 104),
			complete(101, watermark.Duplicate, 104),
		}},
		{"unknown start takes the first delivery", watermark.Unknown, []op{
			complete(5, watermark.UnknownOffset, watermark.Unknown),
			deliver(40, 40, 41),
			complete(41, watermark.Recorded, 40),
			complete(40, watermark.Advanced, 42),
		}},
		{"unknown start takes the first position", watermark.Unknown, []op{
			position(70, true, 70),
			deliver(70, 72),
			complete(72, watermark.Advanced, 73),
		}},
		{"position moves the safe offset when nothing is outstanding", 100, []op{
			deliver(100, 100, 101),
			complete(100, watermark.Advanced, 101),
			position(103, false, 101), // 101 is outstanding
			complete(101, watermark.Advanced, 102),
			position(103, true, 103), // the control record at 102 is skipped
			position(103, false, 103),
			position(102, false, 103),
			deliver(103, 103),
			complete(103, watermark.Advanced, 104),
		}},
		{"a completion in the gap a position skipped is a duplicate", 100, []op{
			position(110, true, 110),
			complete(105, watermark.Duplicate, 110),
		}},
		{"head leaves with every complete record behind it", 0, []op{
			deliver(0, 0, 1, 2, 3, 5, 8, 13),
			complete(13, watermark.Recorded, 0),
			complete(3, watermark.Recorded, 0),
			complete(2, watermark.Recorded, 0),
			complete(1, watermark.Recorded, 0),
			complete(0, watermark.Advanced, 4),
			complete(8, watermark.Recorded, 4),
			complete(5, watermark.Advanced, 14),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := watermark.New(tt.start)
			for i, o := range tt.ops {
				switch o.kind {
				case 'd':
					for _, off := range o.deliver {
						if err := tr.Deliver(off); err != nil {
							t.Fatalf("step %d: Deliver(%d) = %v", i, off, err)
						}
					}
				case 'c':
					if got := tr.Complete(o.complete); got != o.outcome {
						t.Fatalf("step %d: Complete(%d) = %v, want %v", i, o.complete, got, o.outcome)
					}
				case 'p':
					if got := tr.Position(o.position); got != o.moved {
						t.Fatalf("step %d: Position(%d) = %v, want %v", i, o.position, got, o.moved)
					}
				}
				if got := tr.Safe(); got != o.safe {
					t.Fatalf("step %d: Safe() = %d, want %d", i, got, o.safe)
				}
			}
		})
	}
}

func TestTrackerDeliverErrors(t *testing.T) {
	tests := []struct {
		name    string
		start   int64
		before  []int64 // delivered first
		pos     int64   // then Position(pos) if > 0
		offset  int64
		want    error
		wantMsg string
	}{
		{"repeated offset", 100, []int64{100, 103}, 0, 103, watermark.ErrOutOfOrder,
			"watermark: offset 103 delivered after 103: delivered offsets must strictly increase"},
		{"going back", 100, []int64{100, 103}, 0, 101, watermark.ErrOutOfOrder,
			"watermark: offset 101 delivered after 103: delivered offsets must strictly increase"},
		{"below the start", 100, nil, 0, 99, watermark.ErrOutOfOrder,
			"watermark: offset 99 delivered below the safe offset 100"},
		{"below a position the safe offset moved to", 100, nil, 120, 115, watermark.ErrOutOfOrder,
			"watermark: offset 115 delivered below the safe offset 120"},
		{"negative", watermark.Unknown, nil, 0, -1, watermark.ErrInvalidOffset,
			"watermark: invalid offset -1: want 0 <= offset < 2^63-1"},
		{"no next offset", 100, nil, 0, math.MaxInt64, watermark.ErrInvalidOffset,
			"watermark: invalid offset 9223372036854775807: want 0 <= offset < 2^63-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := watermark.New(tt.start)
			for _, off := range tt.before {
				if err := tr.Deliver(off); err != nil {
					t.Fatal(err)
				}
			}
			if tt.pos > 0 && !tr.Position(tt.pos) {
				t.Fatalf("Position(%d) did not move", tt.pos)
			}
			n, safe := tr.Outstanding(), tr.Safe()
			err := tr.Deliver(tt.offset)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Deliver(%d) = %v, want %v", tt.offset, err, tt.want)
			}
			if err.Error() != tt.wantMsg {
				t.Errorf("message %q, want %q", err.Error(), tt.wantMsg)
			}
			var oe *watermark.OrderError
			if errors.As(err, &oe) && oe.Offset != tt.offset {
				t.Errorf("OrderError.Offset = %d, want %d", oe.Offset, tt.offset)
			}
			if tr.Outstanding() != n || tr.Safe() != safe {
				t.Errorf("refused delivery changed the tracker")
			}
		})
	}
}

func TestTrackerInspection(t *testing.T) {
	tr := watermark.New(100)
	if _, ok := tr.Oldest(); ok || tr.Outstanding() != 0 || tr.Last() != watermark.Unknown || tr.Start() != 100 {
		t.Fatalf("fresh tracker: Oldest ok=%v Outstanding=%d Last=%d Start=%d", ok, tr.Outstanding(), tr.Last(), tr.Start())
	}
	for _, off := range []int64{100, 103, 108} {
		if err := tr.Deliver(off); err != nil {
			t.Fatal(err)
		}
	}
	tr.Complete(108)
	tr.Complete(100)
	if got, ok := tr.Oldest(); !ok || got != 103 {
		t.Errorf("Oldest() = %d, %v; want 103, true", got, ok)
	}
	if got := tr.Outstanding(); got != 2 {
		t.Errorf("Outstanding() = %d, want 2 (103 unfinished, 108 complete behind it)", got)
	}
	if off, done := tr.At(1); off != 108 || !done {
		t.Errorf("At(1) = %d, %v; want 108, true", off, done)
	}
	if tr.Last() != 108 {
		t.Errorf("Last() = %d, want 108", tr.Last())
	}
	defer func() {
		if recover() == nil {
			t.Errorf("At(2) did not panic")
		}
	}()
	tr.At(2)
}

func TestTrackerZeroValueAndReset(t *testing.T) {
	var tr watermark.Tracker
	if tr.Safe() != watermark.Unknown || tr.Start() != watermark.Unknown {
		t.Fatalf("zero Tracker: Safe=%d Start=%d, want Unknown", tr.Safe(), tr.Start())
	}
	for off := range int64(100) {
		if err := tr.Deliver(off); err != nil {
			t.Fatal(err)
		}
	}
	tr.Reset(50) // a new assignment may start below the old one
	if tr.Safe() != 50 || tr.Outstanding() != 0 || tr.Last() != watermark.Unknown {
		t.Fatalf("after Reset(50): Safe=%d Outstanding=%d Last=%d", tr.Safe(), tr.Outstanding(), tr.Last())
	}
	if err := tr.Deliver(50); err != nil {
		t.Fatal(err)
	}
	if got := tr.Complete(50); got != watermark.Advanced || tr.Safe() != 51 {
		t.Fatalf("Complete(50) = %v, Safe=%d", got, tr.Safe())
	}
	tr.Reset(watermark.Unknown)
	if tr.Safe() != watermark.Unknown || tr.Position(-3) {
		t.Fatalf("after Reset(Unknown): Safe=%d", tr.Safe())
	}
}

func TestTrackerRingWraps(t *testing.T) {
	// Keep a window of 20 records outstanding while 10,000 pass through, so
	// the ring wraps many times; complete each window in reverse.
	tr := watermark.New(0)
	off := int64(0)
	for range 500 {
		base := off
		for range 20 {
			if err := tr.Deliver(off); err != nil {
				t.Fatal(err)
			}
			off += 1 + off%3 // gaps of 0, 1 and 2
		}
		offs := make([]int64, 0, 20)
		for i := range tr.Outstanding() {
			o, _ := tr.At(i)
			offs = append(offs, o)
		}
		if offs[0] != base {
			t.Fatalf("head %d, want %d", offs[0], base)
		}
		for i := len(offs) - 1; i > 0; i-- {
			if got := tr.Complete(offs[i]); got != watermark.Recorded {
				t.Fatalf("Complete(%d) = %v", offs[i], got)
			}
		}
		if got := tr.Complete(offs[0]); got != watermark.Advanced || tr.Safe() != offs[len(offs)-1]+1 {
			t.Fatalf("Complete(%d) = %v, Safe=%d", offs[0], got, tr.Safe())
		}
	}
}

func TestTrackerAllocations(t *testing.T) {
	// A window of 256 records sliding along: the ring keeps its size.
	tr := watermark.New(0)
	next, oldest := int64(0), int64(0)
	for ; next < 256; next++ {
		_ = tr.Deliver(next * 2)
	}
	slide := func() {
		for range 64 {
			_ = tr.Deliver(next * 2)
			next++
		}
		for range 64 {
			tr.Complete(oldest * 2)
			oldest++
		}
	}
	slide()
	if n := testing.AllocsPerRun(100, slide); n != 0 {
		t.Errorf("a steady window allocates %v times per 64 records, want 0", n)
	}

	// A burst that fills the ring and empties it: the ring grows to the
	// burst's size once, and later bursts reallocate nothing, because only
	// Trim shrinks it. (Complete shrank the ring as soon as it was a
	// quarter full: every burst grew it again, 5 allocations a burst.)
	tr = watermark.New(0)
	off := int64(0)
	burst := func() {
		for i := range 256 {
			_ = tr.Deliver(off + int64(i)*2)
		}
		for i := 255; i >= 0; i-- {
			tr.Complete(off + int64(i)*2)
		}
		tr.Position(off + 600)
		off += 600
	}
	burst()
	if n := testing.AllocsPerRun(100, burst); n != 0 {
		t.Errorf("a burst of 256 records after the first allocates %v times, want 0: only Trim shrinks the ring", n)
	}
	// A Trim between bursts keeps the ring: each interval's peak is a
	// burst, and the ring holds twice that.
	if n := testing.AllocsPerRun(100, func() { burst(); tr.Trim() }); n != 0 {
		t.Errorf("a burst and a Trim allocate %v times, want 0", n)
	}
}

// TestTrackerTrim: Trim shrinks the ring to the least power of two that
// holds twice the most records outstanding since the last Trim, never
// below 16 slots, and RingBytes follows the ring.
func TestTrackerTrim(t *testing.T) {
	tr := watermark.New(0)
	if b := tr.RingBytes(); b != 0 || tr.Trim() {
		t.Fatalf("a new tracker: RingBytes %d, want 0, and nothing to trim", b)
	}
	var next, oldest int64
	deliver := func(n int) {
		for range n {
			if err := tr.Deliver(next); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	complete := func(n int) {
		for range n {
			tr.Complete(oldest)
			oldest++
		}
	}
	step := func(name string, shrunk bool, slots int64) {
		t.Helper()
		if got := tr.Trim(); got != shrunk || tr.RingBytes() != slots*watermark.SlotSize {
			t.Fatalf("%s: Trim() = %v with %d slots, want %v with %d", name, got, tr.RingBytes()/watermark.SlotSize, shrunk, slots)
		}
	}
	deliver(1000) // 1,024 slots
	complete(990) // ten outstanding; Complete does not shrink
	if b := tr.RingBytes(); b != 1024*watermark.SlotSize {
		t.Fatalf("after Complete: RingBytes %d, want %d", b, 1024*watermark.SlotSize)
	}
	step("peak 1,000 since New", false, 1024) // twice 1,000 is 2,048: kept
	step("peak 10 since the last Trim", true, 32)
	step("nothing since", false, 32)
	complete(10)
	step("ten outstanding at the last Trim", false, 32)
	step("none outstanding since", true, 16) // the least ring
	deliver(100)                             // 128 slots
	complete(100)
	deliver(40)
	step("peak 100", false, 128) // twice 100 is 256: kept
	step("peak 40", false, 128)  // twice 40 is 80: 128 slots
	complete(30)
	step("peak 40 again", false, 128)
	step("peak 10", true, 32)
	tr.Reset(next)
	if b := tr.RingBytes(); b != 0 || tr.Trim() {
		t.Fatalf("after Reset: RingBytes %d, want 0, and nothing to trim", b)
	}
}

// TestTrackerRingShrinks: with Trim called periodically, the ring's memory
// follows the outstanding records, not their peak. (It used to keep the
// peak's ring for the assignment's life, and across Reset.)
func TestTrackerRingShrinks(t *testing.T) {
	const peak = 1 << 20
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	tr := watermark.New(0)
	for off := range int64(peak) {
		if err := tr.Deliver(off); err != nil {
			t.Fatal(err)
		}
	}
	for off := int64(peak - 1); off >= 10; off-- { // all but the first ten
		tr.Complete(off)
	}
	for off := range int64(10) {
		tr.Complete(off)
		_ = tr.Deliver(peak + off) // ten outstanding, on a new head
	}
	tr.Trim() // the peak was since the last Trim: kept
	tr.Trim() // ten outstanding since: 32 slots
	runtime.GC()
	runtime.ReadMemStats(&ms)
	held := int64(ms.HeapAlloc) - int64(before)
	bound := int64(max(watermark.MinRingBytes, 4*watermark.SlotSize*tr.Outstanding()))
	if b := tr.RingBytes(); b > bound {
		t.Fatalf("%d records outstanding after a peak of %d and two Trims: RingBytes %d, want at most %d", tr.Outstanding(), peak, b, bound)
	}
	runtime.KeepAlive(tr)
	// The heap is shared with the test runtime: allow 64 KiB of noise,
	// far below the 16 MiB the peak's ring takes.
	if held > bound+64<<10 {
		t.Fatalf("%d records outstanding after a peak of %d hold %d bytes; want at most %d (+64 KiB noise)", tr.Outstanding(), peak, held, bound)
	}
	// An assignment that ended holds no ring.
	tr.Reset(0)
	if n := watermark.RingLen(tr); n != 0 {
		t.Fatalf("after Reset the ring has %d slots, want none", n)
	}
}
