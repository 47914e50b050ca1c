package inbox

import "sort"

// offsetSet is an immutable set of offsets kept as sorted, disjoint runs of
// consecutive offsets. Applied offsets are nearly contiguous (transaction
// markers and compaction leave the only gaps), so 100,000 of them usually
// take a few runs rather than 800 KB. Lookups are a bounds check and a
// binary search; it is safe for concurrent use because nothing changes it
// after it is built.
type offsetSet struct {
	lo, hi []int64 // run i is lo[i]..hi[i], inclusive; hi[i]+1 < lo[i+1]
}

// newOffsetSet builds the set of offs, which may be in any order and hold
// duplicates.
func newOffsetSet(offs []int64) *offsetSet {
	if len(offs) == 0 {
		return &offsetSet{}
	}
	if !sort.SliceIsSorted(offs, func(i, j int) bool { return offs[i] < offs[j] }) {
		offs = append([]int64(nil), offs...)
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	}
	s := &offsetSet{}
	for _, o := range offs {
		n := len(s.hi)
		switch {
		case n > 0 && o <= s.hi[n-1]:
			// duplicate
		case n > 0 && o == s.hi[n-1]+1:
			s.hi[n-1] = o
		default:
			s.lo = append(s.lo, o)
			s.hi = append(s.hi, o)
		}
	}
	return s
}

// contains reports whether off is in the set.
func (s *offsetSet) contains(off int64) bool {
	n := len(s.lo)
	if n == 0 || off < s.lo[0] || off > s.hi[n-1] {
		return false
	}
	// The first run that ends at or after off; off is in it if it starts
	// at or before off.
	i := sort.Search(n, func(i int) bool { return s.hi[i] >= off })
	return s.lo[i] <= off
}

// runs returns the number of runs, for logs.
func (s *offsetSet) runs() int { return len(s.lo) }
