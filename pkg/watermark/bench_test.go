package watermark_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// tracker is what the benchmark drives: the Tracker or the naive baseline.
type tracker interface {
	Deliver(offset int64) error
	Complete(offset int64) watermark.Outcome
	Safe() int64
}

// mapSort is the naive baseline: a map from delivered offset to completed,
// and on every completion the keys sorted to walk the completed prefix.
type mapSort struct {
	safe int64
	recs map[int64]bool
	keys []int64
}

func newMapSort(start int64) *mapSort { return &mapSort{safe: start, recs: map[int64]bool{}} }

func (m *mapSort) Deliver(off int64) error { m.recs[off] = false; return nil }

func (m *mapSort) Safe() int64 { return m.safe }

func (m *mapSort) Complete(off int64) watermark.Outcome {
	done, ok := m.recs[off]
	if !ok {
		return watermark.UnknownOffset
	}
	if done {
		return watermark.Duplicate
	}
	m.recs[off] = true
	m.keys = m.keys[:0]
	for k := range m.recs {
		m.keys = append(m.keys, k)
	}
	slices.Sort(m.keys)
	before := m.safe
	for _, k := range m.keys {
		if !m.recs[k] {
			break
		}
		m.safe = k + 1
		delete(m.recs, k)
	}
	if m.safe != before {
		return watermark.Advanced
	}
	return watermark.Recorded
}

// BenchmarkTracker measures one delivered and completed record per
// operation. Records are delivered in windows of 1,000 (as a fetch hands
// over a batch) and completed in delivery order (inorder) or shuffled within
// the window (shuffled-1k); the -sparse case leaves a gap after about one
// offset in ten, as transaction markers do. Each case runs the Tracker and
// the naive map-and-sort baseline.
func BenchmarkTracker(b *testing.B) {
	const window = 1000
	cases := []struct {
		name    string
		shuffle bool
		sparse  bool
	}{
		{"inorder", false, false},
		{"shuffled-1k", true, false},
		{"shuffled-1k-sparse", true, true},
	}
	impls := []struct {
		name string
		new  func() tracker
	}{
		{"tracker", func() tracker { return watermark.New(0) }},
		{"map-sort", func() tracker { return newMapSort(0) }},
	}
	for _, c := range cases {
		rng := rand.New(rand.NewPCG(1, 2))
		offs := make([]int64, window) // offsets of one window, relative to its base
		var o int64
		for i := range offs {
			offs[i] = o
			o++
			if c.sparse && rng.IntN(10) == 0 {
				o++
			}
		}
		span := o + 1 // every window ends with a gap, like a commit marker
		order := make([]int, window)
		for i := range order {
			order[i] = i
		}
		if c.shuffle {
			rng.Shuffle(window, func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		for _, impl := range impls {
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				t := impl.new()
				var base int64
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					if i == 0 {
						for _, off := range offs {
							if err := t.Deliver(base + off); err != nil {
								b.Fatal(err)
							}
						}
					}
					t.Complete(base + offs[order[i]])
					if i++; i == window {
						if t.Safe() != base+offs[window-1]+1 {
							b.Fatalf("safe %d after window at %d", t.Safe(), base)
						}
						i, base = 0, base+span
					}
				}
			})
		}
	}
}
