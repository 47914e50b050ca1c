package main

// Which records a consumer handled, and how many more than once, across
// the processes of one run: each child tracks the offsets its handlers
// finished in a bitset per partition and reports them as ranges; the
// harness adds the ranges of every child up (multiplicity). A share group
// delivers a record again when its lock expires, its session's connection
// drops or an ack is lost, to the same process or another one; only the
// sum over the processes says whether a record ran twice.

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
)

// offsetRange is the offsets From to To, both included.
type offsetRange struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// partitionRanges is the sorted, disjoint, non-adjacent ranges of one
// partition.
type partitionRanges struct {
	Partition int32         `json:"partition"`
	Ranges    []offsetRange `json:"ranges"`
}

// tracker records the offsets handled, per partition, in fixed bitsets:
// offsets from 0 to limit-1 of partitions 0 to parts-1 (a bench topic is
// fresh, so its offsets start at 0 and stay below its record count). It is
// safe for concurrent use and takes no lock: a no-op handler at C = 256
// calls it for every record.
type tracker struct {
	limit int64
	seen  [][]atomic.Uint64 // [partition][offset/64]
	again [][]atomic.Uint64 // offsets finished at least twice here
	// outside counts the calls for offsets beyond the bitsets.
	outside atomic.Int64
}

func newTracker(parts int, limit int64) *tracker {
	t := &tracker{limit: limit, seen: make([][]atomic.Uint64, parts), again: make([][]atomic.Uint64, parts)}
	words := (limit + 63) / 64
	for p := range parts {
		t.seen[p] = make([]atomic.Uint64, words)
		t.again[p] = make([]atomic.Uint64, words)
	}
	return t
}

// done notes that the record at partition and offset was handled.
func (t *tracker) done(partition int32, offset int64) {
	if partition < 0 || int(partition) >= len(t.seen) || offset < 0 || offset >= t.limit {
		t.outside.Add(1)
		return
	}
	w, bit := offset/64, uint64(1)<<(offset%64)
	if t.seen[partition][w].Or(bit)&bit != 0 {
		t.again[partition][w].Or(bit)
	}
}

// ranges returns the offsets handled (seen) and those handled at least
// twice (again), as ranges per partition; partitions with none are left
// out. Call it once the handlers have stopped.
func (t *tracker) ranges() (seen, again []partitionRanges) {
	return bitRanges(t.seen), bitRanges(t.again)
}

func bitRanges(bits [][]atomic.Uint64) []partitionRanges {
	var out []partitionRanges
	for p, words := range bits {
		var rs []offsetRange
		open := int64(-1)
		for w := range words {
			v := words[w].Load()
			if (v == 0 && open < 0) || (v == ^uint64(0) && open >= 0) {
				continue // nothing starts or ends in this word
			}
			for b := range int64(64) {
				off := int64(w)*64 + b
				switch set := v&(1<<b) != 0; {
				case set && open < 0:
					open = off
				case !set && open >= 0:
					rs = append(rs, offsetRange{open, off - 1})
					open = -1
				}
			}
		}
		if open >= 0 {
			rs = append(rs, offsetRange{open, int64(len(words))*64 - 1})
		}
		if len(rs) > 0 {
			out = append(out, partitionRanges{Partition: int32(p), Ranges: rs})
		}
	}
	return out
}

// multiplicity adds up the ranges of several sets, each a list of
// partitions with sorted disjoint ranges (a child's seen or again), and
// returns how many offsets are in at least one set (distinct) and in at
// least two (more than once: handled by two processes, or twice by one,
// whose again set then holds it as well as its seen set). It fails on a
// set whose ranges are unsorted, overlapping or inverted: a child that
// reports one is broken, and its sums would be wrong.
func multiplicity(sets ...[]partitionRanges) (distinct, multi int64, err error) {
	type edge struct {
		at    int64
		delta int
	}
	byPart := map[int32][]edge{}
	for si, set := range sets {
		for _, pr := range set {
			last := int64(-2)
			for _, r := range pr.Ranges {
				if r.From > r.To || r.From <= last {
					return 0, 0, fmt.Errorf("set %d, partition %d: range %d–%d after %d is not sorted and disjoint", si, pr.Partition, r.From, r.To, last)
				}
				last = r.To
				byPart[pr.Partition] = append(byPart[pr.Partition], edge{r.From, +1}, edge{r.To + 1, -1})
			}
		}
	}
	for _, edges := range byPart {
		slices.SortFunc(edges, func(a, b edge) int { return cmp.Compare(a.at, b.at) })
		depth := 0
		for i, e := range edges {
			depth += e.delta
			if i+1 == len(edges) {
				break
			}
			n := edges[i+1].at - e.at
			if depth >= 1 {
				distinct += n
			}
			if depth >= 2 {
				multi += n
			}
		}
	}
	return distinct, multi, nil
}
