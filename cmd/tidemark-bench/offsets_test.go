package main

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func pr(p int32, rs ...int64) partitionRanges {
	out := partitionRanges{Partition: p}
	for i := 0; i+1 < len(rs); i += 2 {
		out.Ranges = append(out.Ranges, offsetRange{rs[i], rs[i+1]})
	}
	return out
}

func TestTrackerRanges(t *testing.T) {
	tr := newTracker(3, 200)
	for _, off := range []int64{0, 1, 2, 63, 64, 65, 127, 128, 199} {
		tr.done(0, off)
	}
	for off := range int64(200) {
		tr.done(2, off)
	}
	tr.done(2, 5)
	tr.done(2, 5) // a third time: still one offset handled again
	tr.done(2, 199)
	tr.done(0, 64)
	tr.done(1, 200) // beyond the bitsets
	tr.done(3, 0)   // no such partition
	tr.done(0, -1)
	seen, again := tr.ranges()
	wantSeen := []partitionRanges{pr(0, 0, 2, 63, 65, 127, 128, 199, 199), pr(2, 0, 199)}
	wantAgain := []partitionRanges{pr(0, 64, 64), pr(2, 5, 5, 199, 199)}
	if !reflect.DeepEqual(seen, wantSeen) {
		t.Errorf("seen = %v, want %v", seen, wantSeen)
	}
	if !reflect.DeepEqual(again, wantAgain) {
		t.Errorf("again = %v, want %v", again, wantAgain)
	}
	if got := tr.outside.Load(); got != 3 {
		t.Errorf("outside = %d, want 3", got)
	}
}

// TestTrackerConcurrent checks that records handled at once from many
// goroutines are all kept, and each handled twice is found once.
func TestTrackerConcurrent(t *testing.T) {
	const n = 10_000
	tr := newTracker(2, n)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for off := int64(g); off < n; off += 8 {
				tr.done(int32(off%2), off)
				if off%1000 == 0 {
					tr.done(int32(off%2), off)
				}
			}
		})
	}
	wg.Wait()
	seen, again := tr.ranges()
	distinct, multi, err := multiplicity(seen, again)
	if err != nil {
		t.Fatal(err)
	}
	if distinct != n || multi != n/1000 {
		t.Fatalf("distinct %d, more than once %d; want %d, %d", distinct, multi, n, n/1000)
	}
}

func TestMultiplicity(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sets          [][]partitionRanges
		distinct, mul int64
	}{
		{"none", nil, 0, 0},
		{"one set", [][]partitionRanges{{pr(0, 0, 9), pr(1, 0, 4)}}, 15, 0},
		{"disjoint processes", [][]partitionRanges{{pr(0, 0, 9)}, {pr(0, 10, 19)}}, 20, 0},
		{"overlap of two processes", [][]partitionRanges{{pr(0, 0, 9)}, {pr(0, 5, 14)}}, 15, 5},
		{"same offsets, other partitions", [][]partitionRanges{{pr(0, 0, 9)}, {pr(1, 0, 9)}}, 20, 0},
		{"handled twice in one process", [][]partitionRanges{{pr(0, 0, 9)}, {pr(0, 3, 3)}}, 10, 1},
		{"three processes on one offset", [][]partitionRanges{{pr(0, 7, 7)}, {pr(0, 7, 7)}, {pr(0, 7, 7)}}, 1, 1},
		{"ranges ending where another starts", [][]partitionRanges{{pr(0, 0, 4)}, {pr(0, 4, 8)}}, 9, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, m, err := multiplicity(tc.sets...)
			if err != nil {
				t.Fatal(err)
			}
			if d != tc.distinct || m != tc.mul {
				t.Fatalf("distinct %d, more than once %d; want %d, %d", d, m, tc.distinct, tc.mul)
			}
		})
	}
}

func TestMultiplicityRefusesBadRanges(t *testing.T) {
	for _, set := range [][]partitionRanges{
		{pr(0, 5, 4)},       // inverted
		{pr(0, 0, 5, 5, 9)}, // overlapping
		{pr(0, 6, 9, 0, 2)}, // unsorted
	} {
		if _, _, err := multiplicity(set); err == nil || !strings.Contains(err.Error(), "partition 0") {
			t.Errorf("multiplicity(%v) = %v, want an error naming the partition", set, err)
		}
	}
}

// TestMultiplicityAgainstCounts compares the ranges' sums with counting
// every handler call in a map, over random runs of several processes.
func TestMultiplicityAgainstCounts(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 8))
	for range 50 {
		const parts, limit = 3, 300
		procs := 1 + rnd.IntN(4)
		counts := map[[2]int64]int{}
		var sets [][]partitionRanges
		for range procs {
			tr := newTracker(parts, limit)
			for range rnd.IntN(600) {
				p, off := int32(rnd.IntN(parts)), rnd.Int64N(limit)
				tr.done(p, off)
				counts[[2]int64{int64(p), off}]++
			}
			seen, again := tr.ranges()
			sets = append(sets, seen, again)
		}
		var wantD, wantM int64
		for _, c := range counts {
			wantD++
			if c > 1 {
				wantM++
			}
		}
		d, m, err := multiplicity(sets...)
		if err != nil {
			t.Fatal(err)
		}
		if d != wantD || m != wantM {
			t.Fatalf("%d processes: distinct %d, more than once %d; counted %d, %d", procs, d, m, wantD, wantM)
		}
	}
}
