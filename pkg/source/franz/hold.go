package franz

import (
	"slices"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// parkedPart is a paused partition's records that Run took from the client
// and could not hand over before its next poll, deep-copied out of the
// poll's buffers (see parkedCopy), with the position after them and the
// high watermark.
type parkedPart struct {
	recs  []runner.Record
	pos   int64
	hwm   int64
	bytes int64 // parkedSize of everything parked for it, until all is handed over
}

// holding reports whether records of this poll are still held.
func (s *Source) holding() bool {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for i := range s.held {
		if s.held[i].Position >= 0 {
			return true
		}
	}
	return false
}

// take returns up to budget held records of unpaused partitions, parked
// ones first (they are older), with heldMu locked: the caller hands them to
// the runner and unlocks it. It returns nil, with heldMu unlocked, when
// there is nothing to hand over. A batch's position goes with its last
// record, never before, so the runner cannot move a partition's safe
// offset past a record it has not seen.
func (s *Source) take(budget int) []runner.Batch {
	s.heldMu.Lock()
	out := s.out[:0]
	left := budget
	for tp, pp := range s.parked {
		if left == 0 || s.flow.isPaused(tp) {
			continue
		}
		k := min(left, len(pp.recs))
		b := runner.Batch{TP: tp, Records: pp.recs[:k:k], Position: -1, HighWatermark: pp.hwm}
		pp.recs, left = pp.recs[k:], left-k
		if len(pp.recs) == 0 {
			b.Position = pp.pos
			delete(s.parked, tp)
			s.parkedBytes -= pp.bytes
			s.flow.setParked(tp, false) // fetched again from the next poll
		}
		out = append(out, b)
	}
	for i := range s.held {
		b := &s.held[i]
		if b.Position < 0 || s.parked[b.TP] != nil || (left == 0 && len(b.Records) > 0) || s.flow.isPaused(b.TP) {
			continue // handed over, paused, or older records first
		}
		k := min(left, len(b.Records))
		ob := runner.Batch{TP: b.TP, Records: b.Records[:k:k], Position: -1, HighWatermark: b.HighWatermark}
		b.Records, left = b.Records[k:], left-k
		if len(b.Records) == 0 {
			ob.Position, b.Position = b.Position, -1
		}
		out = append(out, ob)
	}
	s.out = out
	if len(out) == 0 {
		s.heldMu.Unlock()
		return nil
	}
	return out
}

// park copies what is still held (records of paused partitions) out of the
// poll's buffers into parked, and releases the buffers for the next poll:
// the copies share no memory with the fetch, so once the runner has copied
// what it was handed, nothing keeps the fetch's buffers alive.
//
// What is parked is bounded by parkLimit. A partition's records that do not
// fit are dropped, and the client fetches them again from the first of them
// once the partition is resumed (refetch, applied after the next poll). So
// the bound never blocks anything: a paused partition waits for the runner
// to resume it, parked or not, and a resumed one is fetched again; records
// are never lost or repeated, since the runner saw none of the dropped ones
// and no position past them.
func (s *Source) park() {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for i := range s.held {
		b := &s.held[i]
		if b.Position < 0 {
			continue
		}
		size := parkedSize(b.Records)
		if s.parkedBytes+size > s.parkLimit {
			s.refetch[b.TP] = b.Records[0].Offset // size > 0: there are records
			s.flow.setRefetch(b.TP)
			continue
		}
		pp := s.parked[b.TP]
		if pp == nil {
			pp = &parkedPart{pos: -1, hwm: -1}
			s.parked[b.TP] = pp
			s.flow.setParked(b.TP, true) // not fetched while parked
		}
		pp.recs = parkedCopy(pp.recs, b.Records)
		pp.pos, pp.hwm = max(pp.pos, b.Position), max(pp.hwm, b.HighWatermark)
		pp.bytes += size
		s.parkedBytes += size
	}
	s.reuse(s.orig)
	// Whole arrays, not only up to len: entries past it, from earlier
	// polls with more partitions, would keep their records and so their
	// fetches alive.
	clear(s.held[:cap(s.held)])
	s.held, s.orig = s.held[:0], nil
	clear(s.out[:cap(s.out)])
}

// applyRewind sets the fetch position of the partitions whose records park
// dropped back to the first of them. Run calls it with heldMu held, after a
// poll and before AllowRebalance: franz-go's SetOffsets must not race a
// revoke, and the callbacks drop a partition's refetch (dropHeld) under
// heldMu before anything else.
func (s *Source) applyRewind() {
	if len(s.refetch) == 0 {
		return
	}
	set := make(map[string]map[int32]kgo.EpochOffset)
	tps := make([]runner.TP, 0, len(s.refetch))
	for tp, off := range s.refetch {
		if set[tp.Topic] == nil {
			set[tp.Topic] = make(map[int32]kgo.EpochOffset)
		}
		// Epoch -1: no truncation check for a position the client had
		// already reached.
		set[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: off}
		tps = append(tps, tp)
	}
	clear(s.refetch)
	s.cl.SetOffsets(set)
	s.flow.refetched(tps) // may be fetched again from the next poll
}

// parkedSize is what parking recs costs: their keys, values and header
// values, and their runner.Record and runner.Header structures.
func parkedSize(recs []runner.Record) int64 {
	n := int64(len(recs)) * int64(unsafe.Sizeof(runner.Record{}))
	for i := range recs {
		n += int64(len(recs[i].Key) + len(recs[i].Value))
		for _, h := range recs[i].Headers {
			n += int64(len(h.Value)) + int64(unsafe.Sizeof(runner.Header{}))
		}
	}
	return n
}

// dropHeld forgets the records held for tps, whose assignment ended or is
// new: they were never handed to the runner, and whoever owns the
// partitions next fetches them again. O(held + tps).
func (s *Source) dropHeld(tps []runner.TP) {
	drop := make(map[runner.TP]bool, len(tps))
	for _, tp := range tps {
		drop[tp] = true
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for i := range s.held {
		if b := &s.held[i]; drop[b.TP] {
			b.Records, b.Position = nil, -1
		}
	}
	for _, tp := range tps {
		if pp := s.parked[tp]; pp != nil {
			s.parkedBytes -= pp.bytes
		}
		delete(s.parked, tp)
		delete(s.refetch, tp)
	}
	s.flow.forget(tps)
}

// parkedCopy appends recs to dst with their keys, values and headers copied
// into one new allocation (and their headers into one more), so that they
// share no memory with the fetch they came from. A nil key or value stays
// nil, an empty one stays empty.
func parkedCopy(dst, recs []runner.Record) []runner.Record {
	var n, nh int
	for i := range recs {
		n += len(recs[i].Key) + len(recs[i].Value)
		for _, h := range recs[i].Headers {
			n += len(h.Value)
		}
		nh += len(recs[i].Headers)
	}
	dst = slices.Grow(dst, len(recs)) // no more than parkedSize counts
	buf := make([]byte, 0, n)
	var hs []runner.Header
	if nh > 0 {
		hs = make([]runner.Header, 0, nh)
	}
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		i := len(buf)
		buf = append(buf, b...)
		return buf[i:len(buf):len(buf)]
	}
	for _, r := range recs {
		r.Key, r.Value = take(r.Key), take(r.Value)
		if len(r.Headers) > 0 {
			i := len(hs)
			for _, h := range r.Headers {
				// Header keys are strings: franz-go copied them out of
				// the fetch already.
				hs = append(hs, runner.Header{Key: h.Key, Value: take(h.Value)})
			}
			r.Headers = hs[i:len(hs):len(hs)]
		}
		dst = append(dst, r)
	}
	return dst
}
