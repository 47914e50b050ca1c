package rebalance_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/rebalance"
	"github.com/tidemark/tidemark/pkg/watermark"
)

// shadow is the model of one partition: ownership and epoch kept by hand,
// and a plain watermark.Tracker (itself checked against a reference model by
// FuzzTracker) fed only the deliveries and the current-epoch completions.
type shadow struct {
	assigned bool
	owned    bool
	epoch    rebalance.Epoch
	epochs   []rebalance.Epoch // every epoch it had, for stale completions
	tracker  *watermark.Tracker
	acked    int64 // Acknowledged() lower bound since the last assign
	sent     int64 // highest offset offered since the last assign
}

// FuzzTable runs random assigns, deliveries, completions tagged with current,
// old and unknown epochs, positions, revokes, losses, and commit rounds with
// answers in any order over three partitions, and checks invariants 1-4
// against the shadow model: a stale completion never moves a watermark and is
// counted, epochs increase across the table, only owned partitions are
// offered for commit, offers never go backwards within an assignment, and the
// acknowledged boundary only rises between assignments.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 0, 100, 1, 0, 3, 2, 0, 0, 5, 0, 0, 6, 0, 0, 0, 0, 7, 0, 0})
	f.Add([]byte{0, 1, 9, 1, 1, 1, 2, 1, 1, 4, 1, 0, 0, 1, 3, 2, 1, 0, 6, 2, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		tps := []rebalance.TP{{Topic: "t", Partition: 0}, {Topic: "t", Partition: 1}, {Topic: "u", Partition: 0}}
		tb := rebalance.NewTable()
		model := make([]shadow, len(tps))
		var (
			lastEpoch         rebalance.Epoch
			oldAssign, notOwn uint64
			inFlight          []rebalance.Commit
		)
		for i := 0; i+2 < len(data); i += 3 {
			op, k, arg := data[i]%8, int(data[i+1])%len(tps), int64(data[i+2])
			tp, m := tps[k], &model[k]
			p := tb.Lookup(tp)
			switch op {
			case 0: // assign, known or Unknown start
				start := arg
				if arg >= 240 {
					start = watermark.Unknown
				}
				prevAcked := watermark.Unknown
				if p != nil {
					prevAcked = p.Acknowledged()
				}
				p = tb.Assign(tp, start)
				if p.Epoch() <= lastEpoch {
					t.Fatalf("epoch %d not above %d", p.Epoch(), lastEpoch)
				}
				lastEpoch = p.Epoch()
				m.assigned, m.owned, m.epoch = true, true, p.Epoch()
				m.epochs = append(m.epochs, p.Epoch())
				m.tracker = watermark.New(start)
				m.acked, m.sent = start, watermark.Unknown
				if start == watermark.Unknown {
					m.acked = prevAcked
				}
				if p.Acknowledged() != m.acked {
					t.Fatalf("%v: Acknowledged() = %d after assign from %d, want %d", tp, p.Acknowledged(), start, m.acked)
				}
			case 1: // deliver a few offsets after the last
				if p == nil {
					break
				}
				base := max(m.tracker.Last()+1, m.tracker.Safe(), 0)
				for j := range arg%4 + 1 {
					off := base + j*(1+arg%3)
					err := p.Deliver(off)
					if !m.owned {
						if err == nil {
							t.Fatalf("%v: Deliver while not owned succeeded", tp)
						}
						break
					}
					if err != nil {
						t.Fatalf("%v: Deliver(%d) = %v", tp, off, err)
					}
					_ = m.tracker.Deliver(off)
				}
			case 2, 3: // complete: current epoch, or an old/unknown one
				epoch := m.epoch
				if op == 3 {
					epoch = rebalance.Epoch(arg % 6)
				}
				var off int64
				if n := m.tracker; n != nil && n.Outstanding() > 0 && arg < 200 {
					off, _ = n.At(int(arg) % n.Outstanding())
				} else if n != nil {
					off = max(n.Safe(), 0) + arg%5 - 2
				}
				var safeBefore int64 = watermark.Unknown
				if p != nil {
					safeBefore = p.Safe()
				}
				got := tb.Complete(tp, epoch, off)
				var want rebalance.Outcome
				switch {
				case !m.owned:
					want = rebalance.NotOwner
					notOwn++
				case epoch != m.epoch:
					want = rebalance.OldAssignment
					oldAssign++
				default:
					want = rebalance.Outcome(m.tracker.Complete(off))
				}
				if got != want {
					t.Fatalf("%v: Complete(epoch %d, %d) = %v, want %v", tp, epoch, off, got, want)
				}
				if (want == rebalance.NotOwner || want == rebalance.OldAssignment) && p != nil && p.Safe() != safeBefore {
					t.Fatalf("%v: a %v completion moved the safe offset %d -> %d", tp, want, safeBefore, p.Safe())
				}
			case 4: // position
				if p == nil {
					break
				}
				pos := max(m.tracker.Last(), m.tracker.Safe()) + arg%4
				got := p.Position(m.epoch, pos)
				want := m.owned && m.tracker.Position(pos)
				if got != want {
					t.Fatalf("%v: Position(%d) = %v, want %v", tp, pos, got, want)
				}
			case 5: // revoke or lose
				if arg%2 == 0 {
					final, ok := tb.Revoke(tp)
					if ok != m.owned || (ok && final != m.tracker.Safe()) {
						t.Fatalf("%v: Revoke = %d, %v; owned %v, safe %d", tp, final, ok, m.owned, m.tracker.Safe())
					}
				} else if tb.Lose(tp) != m.owned {
					t.Fatalf("%v: Lose disagrees with ownership", tp)
				}
				m.owned = false
			case 6: // a commit round
				for _, c := range tb.Pending(nil) {
					cm := &model[indexOf(tps, c.TP)]
					if !cm.owned || c.Epoch != cm.epoch {
						t.Fatalf("Pending offered %+v: owned %v, epoch %d", c, cm.owned, cm.epoch)
					}
					if c.Offset <= cm.acked || c.Offset < cm.sent || c.Offset > cm.tracker.Safe() {
						t.Fatalf("Pending offered %+v: acknowledged %d, sent %d, safe %d", c, cm.acked, cm.sent, cm.tracker.Safe())
					}
					cm.sent = c.Offset
					inFlight = append(inFlight, c)
				}
				// Pending looks only at partitions that changed: it must
				// not miss one that a walk over every partition would offer.
				for k, tp := range tps {
					if p := tb.Lookup(tp); p != nil {
						if c, ok := p.Pending(); ok {
							t.Fatalf("Table.Pending missed %+v for %v (owned %v)", c, tp, model[k].owned)
						}
					}
				}
			case 7: // an answer to any request, in any order
				if len(inFlight) == 0 {
					break
				}
				j := int(arg) % len(inFlight)
				c := inFlight[j]
				inFlight = append(inFlight[:j], inFlight[j+1:]...)
				cm, cp := &model[indexOf(tps, c.TP)], tb.Lookup(c.TP)
				before := cp.Acknowledged()
				if arg%3 == 0 {
					tb.CommitFailed(c)
					if cp.Acknowledged() != before {
						t.Fatalf("CommitFailed(%+v) moved Acknowledged %d -> %d", c, before, cp.Acknowledged())
					}
				} else {
					tb.Committed(c)
					if cp.Acknowledged() < before {
						t.Fatalf("Committed(%+v) lowered Acknowledged %d -> %d", c, before, cp.Acknowledged())
					}
				}
				cm.acked = cp.Acknowledged()
			}
			if o, n := tb.Stale(); o != oldAssign || n != notOwn {
				t.Fatalf("Stale() = %d, %d; want %d, %d", o, n, oldAssign, notOwn)
			}
			for k, tp := range tps {
				p, m := tb.Lookup(tp), &model[k]
				if p == nil {
					if m.assigned {
						t.Fatalf("%v lost from the table", tp)
					}
					continue
				}
				if p.Owned() != m.owned || p.Epoch() != m.epoch || p.Safe() != m.tracker.Safe() {
					t.Fatalf("%v: owned/epoch/safe = %v/%d/%d, model %v/%d/%d", tp, p.Owned(), p.Epoch(), p.Safe(), m.owned, m.epoch, m.tracker.Safe())
				}
				// Invariant 1: nothing delivered and incomplete below the safe offset.
				if old, ok := p.Tracker().Oldest(); ok && old < p.Safe() {
					t.Fatalf("%v: safe %d passes incomplete %d", tp, p.Safe(), old)
				}
			}
		}
	})
}

func indexOf(tps []rebalance.TP, tp rebalance.TP) int {
	for i, x := range tps {
		if x == tp {
			return i
		}
	}
	panic("unknown tp " + tp.String())
}
