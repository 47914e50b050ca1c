package watermark_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// model is the reference for the Tracker: the outstanding delivered records
// in a sorted slice, scanned linearly, with the rules written out plainly.
type model struct {
	started     bool
	start, safe int64
	last        int64 // last delivered offset in this assignment, or Unknown
	recs        []modelRec
	// The most records outstanding at once since the last trim, and in
	// the interval before it (since the reset, if fewer trims).
	peak, prevPeak int
}

type modelRec struct {
	off  int64
	done bool
}

func newModel(start int64) *model {
	m := &model{last: watermark.Unknown}
	m.reset(start)
	return m
}

func (m *model) reset(start int64) {
	m.recs, m.last = m.recs[:0], watermark.Unknown
	m.peak, m.prevPeak = 0, 0
	m.started, m.start, m.safe = start >= 0, start, start
	if !m.started {
		m.start, m.safe = watermark.Unknown, watermark.Unknown
	}
}

func (m *model) deliver(off int64) error {
	switch {
	case off < 0 || off == math.MaxInt64:
		return watermark.ErrInvalidOffset
	case off <= m.last, m.started && off < m.safe:
		return watermark.ErrOutOfOrder
	}
	if !m.started {
		m.started, m.start, m.safe = true, off, off
	}
	m.recs = append(m.recs, modelRec{off: off})
	m.last = off
	m.peak = max(m.peak, len(m.recs))
	return nil
}

func (m *model) trim() {
	m.prevPeak, m.peak = m.peak, len(m.recs)
}

// ringLimit is the most slots the ring may hold: the least power of two at
// or above twice the most records outstanding since the last trim but one,
// at least 16.
func (m *model) ringLimit() int {
	n := 16
	for n < 2*max(m.peak, m.prevPeak) {
		n *= 2
	}
	return n
}

func (m *model) complete(off int64) watermark.Outcome {
	if m.started && off < m.safe {
		return watermark.Duplicate
	}
	i := slices.IndexFunc(m.recs, func(r modelRec) bool { return r.off == off })
	if i < 0 {
		return watermark.UnknownOffset
	}
	if m.recs[i].done {
		return watermark.Duplicate
	}
	m.recs[i].done = true
	before := m.safe
	for len(m.recs) > 0 && m.recs[0].done {
		m.safe = m.recs[0].off + 1
		m.recs = m.recs[1:]
	}
	if m.safe != before {
		return watermark.Advanced
	}
	return watermark.Recorded
}

func (m *model) position(pos int64) bool {
	if pos < 0 {
		return false
	}
	if !m.started {
		m.started, m.start, m.safe = true, pos, pos
		return true
	}
	if len(m.recs) > 0 || pos <= m.safe {
		return false
	}
	m.safe = pos
	return true
}

// FuzzTracker drives a Tracker and the model with the same random
// deliveries (with gaps, repeats and regressions), completions (of delivered,
// completed, gap and far offsets), positions, trims and resets (new
// assignments, known or Unknown start) and compares every result and every
// observable, and checks the ring's size against its stated bound.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 0, 8, 1, 2, 1, 0, 1, 1}) // the seed's sparse trace, roughly
	f.Add([]byte{3, 200, 0, 1, 0, 1, 0, 0, 1, 0, 2, 5, 1, 0, 2, 9})
	f.Add([]byte{3, 255, 2, 4, 0, 0, 0, 130, 1, 255, 1, 3})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0, 4, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 4, 4, 1, 0, 1, 0, 4, 4}) // grow, drain, trim twice
	f.Fuzz(func(t *testing.T, data []byte) {
		tr := watermark.New(100)
		m := newModel(100)
		next := func() int64 {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int64(b)
		}
		for step := 0; len(data) > 0; step++ {
			switch next() % 5 {
			case 0: // deliver: mostly dense, sometimes gaps, sometimes out of order
				b := next()
				base := max(m.last, m.safe-1)
				var off int64
				switch {
				case b < 160:
					off = base + 1
				case b < 230:
					off = base + 1 + b%7
				case b < 250:
					off = base - b%3 // a repeat or a regression
				case b < 254:
					off = -1 - b%2
				default:
					off = math.MaxInt64
				}
				got, want := tr.Deliver(off), m.deliver(off)
				if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
					t.Fatalf("step %d: Deliver(%d) = %v, model %v", step, off, got, want)
				}
			case 1: // complete: an outstanding record, or anything nearby
				b := next()
				var off int64
				if n := len(m.recs); n > 0 && b < 200 {
					off = m.recs[int(b)%n].off
				} else {
					off = max(m.safe, 0) + b%16 - 8
				}
				if got, want := tr.Complete(off), m.complete(off); got != want {
					t.Fatalf("step %d: Complete(%d) = %v, model %v", step, off, got, want)
				}
			case 2: // position: near the last delivered offset
				pos := max(m.last, m.safe) + next()%8 - 2
				if got, want := tr.Position(pos), m.position(pos); got != want {
					t.Fatalf("step %d: Position(%d) = %v, model %v", step, pos, got, want)
				}
			case 3: // a new assignment (a new epoch)
				b := next()
				start := b * 3
				if b >= 200 {
					start = watermark.Unknown
				}
				tr.Reset(start)
				m.reset(start)
			case 4: // the runner's tick
				before := watermark.RingLen(tr)
				shrunk := tr.Trim()
				m.trim()
				if after := watermark.RingLen(tr); shrunk != (after < before) {
					t.Fatalf("step %d: Trim() = %v, the ring went from %d to %d slots", step, shrunk, before, after)
				}
			}
			check(t, step, tr, m)
		}
	})
}

func check(t *testing.T, step int, tr *watermark.Tracker, m *model) {
	t.Helper()
	if tr.Safe() != m.safe || tr.Start() != m.start || tr.Last() != m.last {
		t.Fatalf("step %d: Safe/Start/Last = %d/%d/%d, model %d/%d/%d", step, tr.Safe(), tr.Start(), tr.Last(), m.safe, m.start, m.last)
	}
	if tr.Outstanding() != len(m.recs) {
		t.Fatalf("step %d: Outstanding() = %d, model %d", step, tr.Outstanding(), len(m.recs))
	}
	for i, r := range m.recs {
		if off, done := tr.At(i); off != r.off || done != r.done {
			t.Fatalf("step %d: At(%d) = %d, %v; model %d, %v", step, i, off, done, r.off, r.done)
		}
	}
	// The ring's stated size: none, or a power of two of at least 16
	// slots that holds the outstanding records, and at most ringLimit.
	ring := watermark.RingLen(tr)
	if ring != 0 && (ring < 16 || ring&(ring-1) != 0 || ring < len(m.recs) || ring > m.ringLimit()) {
		t.Fatalf("step %d: the ring has %d slots for %d outstanding records, peaks %d and %d: want a power of two in [max(16, %d), %d]",
			step, ring, len(m.recs), m.peak, m.prevPeak, len(m.recs), m.ringLimit())
	}
	if ring == 0 && len(m.recs) > 0 {
		t.Fatalf("step %d: no ring for %d outstanding records", step, len(m.recs))
	}
	if b := tr.RingBytes(); b != int64(ring)*watermark.SlotSize {
		t.Fatalf("step %d: RingBytes %d for %d slots", step, b, ring)
	}
	oldest, ok := tr.Oldest()
	if len(m.recs) > 0 != ok || (ok && oldest != m.recs[0].off) {
		t.Fatalf("step %d: Oldest() = %d, %v; model %v", step, oldest, ok, m.recs)
	}
	// Invariant 1: nothing delivered and incomplete lies below the safe offset.
	for _, r := range m.recs {
		if !r.done && r.off < tr.Safe() {
			t.Fatalf("step %d: safe offset %d passes incomplete %d", step, tr.Safe(), r.off)
		}
	}
}

// FuzzSequencer checks invariant 2 under any order of answers: requests are
// never below one already sent or acknowledged, the acknowledged boundary
// never goes down between resets, and nothing is sent at or below it.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 3, 0, 10, 1, 1, 1, 0, 2, 0, 0, 10})
	f.Add([]byte{0, 3, 2, 0, 0, 3, 3, 50, 1, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var s watermark.Sequencer
		var (
			safe    int64               = 100
			issued  []watermark.Request // since the last Reset
			highest int64               = watermark.Unknown
		)
		s.Reset(safe)
		for i := 0; i+1 < len(data); i += 2 {
			op, arg := data[i]%4, int(data[i+1])
			ackedBefore := s.Acknowledged()
			switch op {
			case 0: // the safe offset moves (or not) and the poll loop asks
				safe += int64(arg % 5)
				r, ok := s.Next(safe)
				if !ok {
					break
				}
				if r.Offset != safe {
					t.Fatalf("Next(%d) sent %d", safe, r.Offset)
				}
				if r.Offset <= ackedBefore || r.Offset < highest {
					t.Fatalf("Next(%d) sent %d; acknowledged %d, highest sent %d", safe, r.Offset, ackedBefore, highest)
				}
				if f, ok := s.InFlight(); !ok || f != r {
					t.Fatalf("InFlight() = %+v, %v after sending %+v", f, ok, r)
				}
				highest = r.Offset
				issued = append(issued, r)
			case 1, 2: // an answer to any request, in any order, even twice
				if len(issued) == 0 {
					break
				}
				r := issued[arg%len(issued)]
				if op == 1 {
					s.Acked(r)
					if want := max(ackedBefore, r.Offset); s.Acknowledged() != want {
						t.Fatalf("Acked(%+v): Acknowledged() = %d, want %d", r, s.Acknowledged(), want)
					}
				} else {
					s.Failed(r)
				}
			case 3: // a new assignment: the broker's start is authoritative
				if arg%3 == 0 {
					s.Reset(watermark.Unknown)
					safe, highest = 0, watermark.Unknown
				} else {
					safe = int64(arg)
					s.Reset(safe)
					highest = watermark.Unknown
				}
				stale := issued
				issued = nil
				for _, r := range stale {
					before := s.Acknowledged()
					s.Acked(r) // answers from before the Reset are ignored
					if s.Acknowledged() != before {
						t.Fatalf("answer %+v from before Reset moved Acknowledged to %d", r, s.Acknowledged())
					}
				}
				continue
			}
			if s.Acknowledged() < ackedBefore {
				t.Fatalf("Acknowledged() went down from %d to %d", ackedBefore, s.Acknowledged())
			}
		}
	})
}
