package rebalance_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
	"github.com/tidemark/tidemark/pkg/watermark"
)

var (
	tpA = rebalance.TP{Topic: "orders", Partition: 0}
	tpB = rebalance.TP{Topic: "orders", Partition: 1}
)

func TestTPString(t *testing.T) {
	if got := (rebalance.TP{Topic: "orders", Partition: 7}).String(); got != "orders/7" {
		t.Errorf("String() = %q", got)
	}
}

func TestOutcomeString(t *testing.T) {
	want := map[rebalance.Outcome]string{
		rebalance.Advanced: "advanced", rebalance.Recorded: "recorded", rebalance.Duplicate: "duplicate",
		rebalance.UnknownOffset: "unknown-offset", rebalance.OldAssignment: "old-assignment",
		rebalance.NotOwner: "not-owner", 0: "Outcome(0)",
	}
	for o, s := range want {
		if o.String() != s {
			t.Errorf("Outcome(%d).String() = %q, want %q", o, o.String(), s)
		}
	}
}

// TestComplete covers every outcome of Table.Complete. Each case starts from
// tpA assigned at 100 (epoch 1) with [100, 103, 108] delivered and 108
// complete, then applies setup and one completion.
func TestComplete(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(tb *rebalance.Table)
		tp        rebalance.TP
		epoch     rebalance.Epoch
		offset    int64
		want      rebalance.Outcome
		wantSafe  int64
		wantStale [2]uint64
	}{
		{"advanced", nil, tpA, 1, 100, rebalance.Advanced, 101, [2]uint64{}},
		{"recorded", nil, tpA, 1, 103, rebalance.Recorded, 100, [2]uint64{}},
		{"duplicate", nil, tpA, 1, 108, rebalance.Duplicate, 100, [2]uint64{}},
		{"duplicate below safe", func(tb *rebalance.Table) { tb.Complete(tpA, 1, 100) }, tpA, 1, 100, rebalance.Duplicate, 101, [2]uint64{}},
		{"unknown offset", nil, tpA, 1, 101, rebalance.UnknownOffset, 100, [2]uint64{}},
		{"old assignment", func(tb *rebalance.Table) {
			tb.Assign(tpA, 100)
			deliverAll(t, tb.Lookup(tpA), 100, 103, 108)
		}, tpA, 1, 100, rebalance.OldAssignment, 100, [2]uint64{1, 0}},
		{"future epoch is not current either", nil, tpA, 9, 100, rebalance.OldAssignment, 100, [2]uint64{1, 0}},
		{"not owner after revoke", func(tb *rebalance.Table) { tb.Revoke(tpA) }, tpA, 1, 100, rebalance.NotOwner, 100, [2]uint64{0, 1}},
		{"not owner after lost", func(tb *rebalance.Table) { tb.Lose(tpA) }, tpA, 1, 100, rebalance.NotOwner, 100, [2]uint64{0, 1}},
		{"not owner, never assigned", nil, tpB, 1, 100, rebalance.NotOwner, 100, [2]uint64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := rebalance.NewTable()
			p := tb.Assign(tpA, 100)
			deliverAll(t, p, 100, 103, 108)
			if got := tb.Complete(tpA, 1, 108); got != rebalance.Recorded {
				t.Fatalf("setup Complete(108) = %v", got)
			}
			if tt.setup != nil {
				tt.setup(tb)
			}
			if got := tb.Complete(tt.tp, tt.epoch, tt.offset); got != tt.want {
				t.Fatalf("Complete(%v, %d, %d) = %v, want %v", tt.tp, tt.epoch, tt.offset, got, tt.want)
			}
			if got := p.Safe(); got != tt.wantSafe {
				t.Errorf("Safe() = %d, want %d", got, tt.wantSafe)
			}
			if o, n := tb.Stale(); o != tt.wantStale[0] || n != tt.wantStale[1] {
				t.Errorf("Stale() = %d, %d; want %d, %d", o, n, tt.wantStale[0], tt.wantStale[1])
			}
		})
	}
}

func deliverAll(t *testing.T, p *rebalance.Partition, offs ...int64) {
	t.Helper()
	for _, off := range offs {
		if err := p.Deliver(off); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAssignEpochs(t *testing.T) {
	tb := rebalance.NewTable()
	a1 := tb.Assign(tpA, 100)
	b1 := tb.Assign(tpB, 0)
	if a1.Epoch() != 1 || b1.Epoch() != 2 {
		t.Fatalf("epochs %d, %d; want 1, 2 (one counter across the table)", a1.Epoch(), b1.Epoch())
	}
	deliverAll(t, a1, 100, 101)
	a2 := tb.Assign(tpA, 200) // still owned: a rejoin with the same partition
	if a2 != a1 || a2.Epoch() != 3 || !a2.Owned() {
		t.Fatalf("reassign: same=%v epoch=%d owned=%v", a2 == a1, a2.Epoch(), a2.Owned())
	}
	if a2.Safe() != 200 || a2.Tracker().Outstanding() != 0 {
		t.Fatalf("reassign kept the old tracker: Safe=%d Outstanding=%d", a2.Safe(), a2.Tracker().Outstanding())
	}
	if got := tb.Complete(tpA, 1, 100); got != rebalance.OldAssignment {
		t.Fatalf("epoch 1 completion after reassign = %v", got)
	}
	if tb.Lookup(tpA) != a1 || tb.Lookup(rebalance.TP{Topic: "x"}) != nil {
		t.Fatalf("Lookup")
	}

	tests := []struct {
		name  string
		epoch rebalance.Epoch
		ok    bool
	}{
		{"equal to the last", 3, false},
		{"below the last", 2, false},
		{"zero", 0, false},
		{"above", 10, true},
		{"after a gap, the counter continues from it", 11, true},
	}
	for _, tt := range tests {
		p, err := tb.AssignEpoch(tpB, tt.epoch, 5)
		if tt.ok != (err == nil) {
			t.Fatalf("%s: AssignEpoch(%d) = %v", tt.name, tt.epoch, err)
		}
		if err != nil {
			var ee *rebalance.EpochError
			if !errors.Is(err, rebalance.ErrEpochOrder) || !errors.As(err, &ee) || ee.Epoch != tt.epoch || ee.TP != tpB {
				t.Fatalf("%s: error %#v", tt.name, err)
			}
			if p != nil {
				t.Fatalf("%s: partition returned with an error", tt.name)
			}
			continue
		}
		if p.Epoch() != tt.epoch {
			t.Fatalf("%s: Epoch() = %d", tt.name, p.Epoch())
		}
	}
	if p := tb.Assign(tpA, 0); p.Epoch() != 12 {
		t.Fatalf("Assign after AssignEpoch(11): epoch %d, want 12", p.Epoch())
	}
}

func TestRevokeAndLose(t *testing.T) {
	tb := rebalance.NewTable()
	p := tb.Assign(tpA, 100)
	deliverAll(t, p, 100, 103, 108)
	tb.Complete(tpA, 1, 100)
	final, ok := tb.Revoke(tpA)
	if !ok || final != 101 {
		t.Fatalf("Revoke = %d, %v; want 101, true", final, ok)
	}
	if p.Owned() || p.Safe() != 101 || p.Epoch() != 1 {
		t.Fatalf("after revoke: Owned=%v Safe=%d Epoch=%d", p.Owned(), p.Safe(), p.Epoch())
	}
	if _, ok := tb.Revoke(tpA); ok {
		t.Fatalf("second Revoke ok")
	}
	if _, ok := tb.Revoke(tpB); ok {
		t.Fatalf("Revoke of a partition never assigned ok")
	}
	if tb.Lose(tpA) || tb.Lose(tpB) {
		t.Fatalf("Lose of a partition not owned reported true")
	}
	err := p.Deliver(109)
	var de *rebalance.DeliveryError
	if !errors.Is(err, rebalance.ErrNotOwned) || !errors.As(err, &de) || de.TP != tpA || de.Offset != 109 {
		t.Fatalf("Deliver after revoke = %v", err)
	}
	if want := "rebalance: deliver orders/0@109: rebalance: partition not owned"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}

	p = tb.Assign(tpA, 101)
	if !tb.Lose(tpA) || p.Owned() {
		t.Fatalf("Lose")
	}
	if c := tb.Pending(nil); len(c) != 0 {
		t.Fatalf("Pending after Lose = %v (invariant 4)", c)
	}
}

func TestDeliverOrderError(t *testing.T) {
	tb := rebalance.NewTable()
	p := tb.Assign(tpB, 100)
	deliverAll(t, p, 100, 103)
	err := p.Deliver(101)
	var oe *watermark.OrderError
	if !errors.Is(err, watermark.ErrOutOfOrder) || !errors.As(err, &oe) || oe.Last != 103 {
		t.Fatalf("Deliver(101) = %v", err)
	}
	if want := "rebalance: deliver orders/1@101: watermark: offset 101 delivered after 103: delivered offsets must strictly increase"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
}

func TestPositionFencing(t *testing.T) {
	tb := rebalance.NewTable()
	p := tb.Assign(tpA, 100)
	tests := []struct {
		name  string
		epoch rebalance.Epoch
		pos   int64
		moved bool
		safe  int64
	}{
		{"old epoch", 0, 105, false, 100},
		{"current epoch", 1, 105, true, 105},
		{"not beyond", 1, 105, false, 105},
	}
	for _, tt := range tests {
		if got := p.Position(tt.epoch, tt.pos); got != tt.moved || p.Safe() != tt.safe {
			t.Fatalf("%s: Position = %v, Safe = %d", tt.name, got, p.Safe())
		}
	}
	tb.Revoke(tpA)
	if p.Position(1, 200) {
		t.Fatalf("Position moved a revoked partition")
	}
}

func TestOwned(t *testing.T) {
	tb := rebalance.NewTable()
	tpC := rebalance.TP{Topic: "audit", Partition: 0}
	tb.Assign(tpB, 0)
	tb.Assign(tpA, 0)
	tb.Assign(tpC, 0)
	tb.Revoke(tpA)
	got := tb.Owned(nil)
	var names []rebalance.TP
	for _, p := range got {
		names = append(names, p.TP())
	}
	if !slices.Equal(names, []rebalance.TP{tpB, tpC}) {
		t.Fatalf("Owned = %v, want [orders/1 audit/0] in assignment order", names)
	}
}

// TestCommits covers commit sequencing through the table: only owned
// partitions are offered, late and failed answers, answers after a revoke,
// and how a new assignment's start meets the acknowledged boundary.
func TestCommits(t *testing.T) {
	tb := rebalance.NewTable()
	a := tb.Assign(tpA, 100)
	b := tb.Assign(tpB, 0)
	tb.Assign(rebalance.TP{Topic: "idle", Partition: 0}, watermark.Unknown) // no safe offset yet

	if c := tb.Pending(nil); len(c) != 0 {
		t.Fatalf("Pending with nothing new = %v", c)
	}
	deliverAll(t, a, 100, 101, 102)
	deliverAll(t, b, 0, 1)
	tb.Complete(tpA, a.Epoch(), 100)
	tb.Complete(tpB, b.Epoch(), 0)
	first := tb.Pending(nil)
	if len(first) != 2 || first[0].TP != tpA || first[0].Offset != 101 || first[1].TP != tpB || first[1].Offset != 1 {
		t.Fatalf("Pending = %+v", first)
	}
	if first[0].Epoch != a.Epoch() {
		t.Fatalf("Commit epoch %d, want %d", first[0].Epoch, a.Epoch())
	}
	if c := tb.Pending(nil); len(c) != 0 {
		t.Fatalf("Pending while in flight = %+v", c)
	}

	// tpA: 101 is in flight when 102 becomes safe; the newer answer comes first.
	tb.Complete(tpA, a.Epoch(), 101)
	second := tb.Pending(nil)
	if len(second) != 1 || second[0].Offset != 102 {
		t.Fatalf("Pending = %+v, want tpA@102", second)
	}
	tb.Committed(second[0])
	tb.Committed(first[0]) // late answer to the older request
	if a.Acknowledged() != 102 {
		t.Fatalf("Acknowledged() = %d after a late answer, want 102", a.Acknowledged())
	}

	// tpB: the request fails; the next Pending sends the newest safe offset.
	tb.Complete(tpB, b.Epoch(), 1)
	tb.CommitFailed(first[1])
	if b.Acknowledged() != 0 {
		t.Fatalf("a failed commit changed Acknowledged to %d", b.Acknowledged())
	}
	third := tb.Pending(nil)
	if len(third) != 1 || third[0].TP != tpB || third[0].Offset != 2 {
		t.Fatalf("Pending after failure = %+v, want tpB@2", third)
	}

	// Revoke tpB: never offered again, but its answer still counts.
	if final, ok := tb.Revoke(tpB); !ok || final != 2 {
		t.Fatalf("Revoke = %d, %v", final, ok)
	}
	tb.Committed(third[0])
	if b.Acknowledged() != 2 {
		t.Fatalf("answer after revoke: Acknowledged() = %d, want 2", b.Acknowledged())
	}
	tb.Complete(tpA, a.Epoch(), 102)
	for _, c := range tb.Pending(nil) {
		if c.TP == tpB {
			t.Fatalf("revoked partition offered: %+v", c)
		}
	}

	// Reassign tpB with an Unknown start: the acknowledged boundary carries
	// over, so the replayed 0..2 are not committed again.
	b2 := tb.Assign(tpB, watermark.Unknown)
	if b2.Acknowledged() != 2 {
		t.Fatalf("Unknown start: Acknowledged() = %d, want 2", b2.Acknowledged())
	}
	deliverAll(t, b2, 1, 2)
	tb.Complete(tpB, b2.Epoch(), 1)
	if c, ok := b2.Pending(); ok {
		t.Fatalf("Pending at the acknowledged boundary: %+v", c)
	}
	tb.Complete(tpB, b2.Epoch(), 2)
	c, ok := b2.Pending()
	if !ok || c.Offset != 3 {
		t.Fatalf("Pending = %+v, %v; want 3", c, ok)
	}

	// Reassign with a known start: the broker's word replaces the boundary,
	// and the answer to a request from the previous assignment is ignored.
	b3 := tb.Assign(tpB, 1)
	tb.Committed(c)
	if b3.Acknowledged() != 1 {
		t.Fatalf("known start: Acknowledged() = %d, want 1", b3.Acknowledged())
	}
	tb.Committed(rebalance.Commit{TP: rebalance.TP{Topic: "never"}, Seq: 1, Offset: 5}) // ignored
	tb.CommitFailed(rebalance.Commit{TP: rebalance.TP{Topic: "never"}, Seq: 1, Offset: 5})
}

func TestPartitionPendingNotOwned(t *testing.T) {
	tb := rebalance.NewTable()
	p := tb.Assign(tpA, 100)
	deliverAll(t, p, 100)
	tb.Complete(tpA, p.Epoch(), 100)
	tb.Lose(tpA)
	if c, ok := p.Pending(); ok {
		t.Fatalf("Pending on a lost partition = %+v", c)
	}
}

func TestHotPathAllocations(t *testing.T) {
	// A window of 64 outstanding records sliding along, completed out of
	// order (a burst that empties the tracker reallocates its ring, see
	// watermark's TestTrackerAllocations).
	tb := rebalance.NewTable()
	p := tb.Assign(tpA, 0)
	var buf []rebalance.Commit
	off := int64(0)
	for i := range 64 {
		_ = p.Deliver(int64(i))
	}
	round := func() {
		for i := range 64 {
			_ = p.Deliver(off + 64 + int64(i))
		}
		for i := 63; i >= 0; i-- {
			tb.Complete(tpA, p.Epoch(), off+int64(i))
		}
		off += 64
		buf = tb.Pending(buf[:0])
		for _, c := range buf {
			tb.Committed(c)
		}
	}
	round()
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Errorf("deliver/complete/commit allocates %v times per round, want 0", n)
	}
}

// TestPendingCostFollowsChanges: Pending's cost follows the partitions that
// changed, not every partition ever assigned. A table that has seen 100,000
// partitions come and go, with one owned, commits as fast as a table that
// only ever had that one. (Pending used to walk every partition ever
// assigned: about 100,000 times slower here.)
func TestPendingCostFollowsChanges(t *testing.T) {
	perCommit := func(ever int) time.Duration {
		tb := rebalance.NewTable()
		for i := range ever {
			tp := rebalance.TP{Topic: "gone", Partition: int32(i)}
			tb.Assign(tp, 0)
			tb.Revoke(tp)
		}
		tb.Pending(nil)
		p := tb.Assign(tpA, 0)
		var buf []rebalance.Commit
		const rounds = 2000
		start := time.Now()
		for off := range int64(rounds) {
			if err := p.Deliver(off); err != nil {
				t.Fatal(err)
			}
			tb.Complete(tpA, p.Epoch(), off)
			buf = tb.Pending(buf[:0])
			if len(buf) != 1 || buf[0].Offset != off+1 {
				t.Fatalf("Pending = %+v, want %v@%d", buf, tpA, off+1)
			}
			tb.Committed(buf[0])
		}
		return time.Since(start) / rounds
	}
	// The best of five: a loaded machine only ever adds time. The work
	// differs by 100,000 times if Pending walks every partition; 1,000
	// times leaves room for the rest of the noise.
	best := func(ever int) time.Duration {
		d := perCommit(ever)
		for range 4 {
			d = min(d, perCommit(ever))
		}
		return d
	}
	alone, crowded := best(1), best(100_000)
	if crowded > 1000*alone+time.Microsecond {
		t.Fatalf("Pending costs %v with 100,000 partitions assigned before, %v with one: it grows with the partitions ever assigned", crowded, alone)
	}
}
