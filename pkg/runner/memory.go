package runner

import (
	"slices"
	"unsafe"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// Memory accounting (invariant 6; docs/runner.md, "Memory"). The runner
// charges every record it keeps the memory that record costs it, so that
// the byte water marks and MaxBufferedBytes bound memory, not payload:
//
//   - its payload: the one allocation holding its key, value and header
//     bytes (copied by copyRecord, so that it pins no buffer of the
//     source's), as the allocator sized it, and its header slice;
//   - RecordOverhead(o): its task, and in KeyOrder a key lane (a busy
//     lane holds at least one record; a lane held by a fenced record is
//     charged apart, and idle lanes live in the free room, see pushIdle).
//
// Each partition is charged its tracker ring's bytes beyond the least ring
// (setRing), exactly: the ring grows in a hand-over and shrinks only on the
// tick (trimRings), so the charge changes then. What a partition costs
// whatever its records is PartitionOverhead; it is not charged.

var (
	// taskAlloc and laneAlloc are what the allocator takes for a task and
	// a lane (their size classes).
	taskAlloc = allocSize(int(unsafe.Sizeof(task{})))
	laneAlloc = allocSize(int(unsafe.Sizeof(lane{})))
)

const (
	headerSize = int64(unsafe.Sizeof(Header{}))
	// laneEntryBytes bounds what one key lane takes in its partition's
	// map: a map[uint64]*lane entry takes at most 41 bytes (measured with
	// Go 1.26's maps, just after the table grew), and the map is rebuilt
	// once evictions left it less than half full (shrinkLanes), so at most
	// twice that.
	laneEntryBytes = 82
	// laneMapMin is the most lanes a map may have had and still not be
	// rebuilt when it empties: PartitionOverhead covers such a map.
	laneMapMin = 8
)

// laneCharge is what one key lane costs: the lane and its map entry.
var laneCharge = laneAlloc + laneEntryBytes

// allocSize returns the size of the allocation the runtime makes for n
// bytes (its size class). It allocates: call it at init only.
func allocSize(n int) int64 { return int64(cap(slices.Grow([]byte(nil), n))) }

// RecordOverhead is what the runner charges each record it buffers or
// runs, on top of its payload (the allocation holding its key, value and
// header bytes, and its header slice), against the byte water marks and
// MaxBufferedBytes, for ordering mode o: the record's task, and in KeyOrder
// one key lane (a busy lane holds at least one record; idle lanes are
// cached only in the room the records leave under the global limit). The
// partition's tracker ring is charged apart, at its size. With Go 1.26 on
// amd64 it is 402 bytes in KeyOrder and 256 in the other modes.
func RecordOverhead(o Ordering) int64 {
	n := taskAlloc
	if o == KeyOrder {
		n += laneCharge
	}
	return n
}

// PartitionOverhead bounds, in bytes, what the runner keeps for each
// partition it owns whatever its records: the partition's state, its
// tracker's least ring, its lane map (emptied, once its lanes went idle
// and were given back), its context and its entries in the runner's tables and stats. It is not
// charged against MaxBufferedBytes: budget it per assigned partition
// (TestPartitionOverhead measures it).
const PartitionOverhead = 3 << 10

// PartitionGoneOverhead bounds, in bytes, what the runner keeps for a
// partition it owned and no longer owns, until the process ends: its entry
// in the ownership table (its last acknowledged commit, which a later
// assignment with an unknown start needs).
const PartitionGoneOverhead = 768

// copyRecord sets dst to a copy of src that shares no memory with it:
// Key, Value and the header keys and values in one new allocation (never
// reused, so a handler may keep the Record), the headers in another. A nil
// key, value or header value stays nil. It returns the bytes to charge
// for the copy's payload.
func copyRecord(dst, src *Record) int64 {
	*dst = *src
	n := len(src.Key) + len(src.Value)
	for i := range src.Headers {
		n += len(src.Headers[i].Key) + len(src.Headers[i].Value)
	}
	var buf []byte
	var charge int64
	if n > 0 {
		// slices.Grow sizes the allocation to its size class and reports
		// it in cap: that is what the copy costs.
		buf = slices.Grow([]byte(nil), n)
		charge = int64(cap(buf))
	}
	dst.Key, buf = cut(buf, src.Key)
	dst.Value, buf = cut(buf, src.Value)
	if src.Headers != nil {
		hs := make([]Header, len(src.Headers))
		charge += int64(cap(hs)+1) * headerSize // +1: the allocation rounds up
		for i, h := range src.Headers {
			var k []byte
			k, buf = cut(buf, unsafe.Slice(unsafe.StringData(h.Key), len(h.Key)))
			// Nothing writes buf after the copy: a string over it is as
			// immutable as any.
			hs[i].Key = unsafe.String(unsafe.SliceData(k), len(k))
			hs[i].Value, buf = cut(buf, h.Value)
		}
		dst.Headers = hs
	}
	return charge
}

// emptyBytes backs the copies of empty, non-nil byte slices.
var emptyBytes [0]byte

// cut appends b to buf and returns the copy (nil for a nil b, capacity
// limited so that appending to it cannot overwrite what follows) and buf.
func cut(buf, b []byte) ([]byte, []byte) {
	if b == nil {
		return nil, buf
	}
	if len(b) == 0 {
		return emptyBytes[:], buf
	}
	k := len(buf)
	buf = append(buf, b...)
	return buf[k:len(buf):len(buf)], buf
}

// The free lists keep tasks and lanes for reuse, and the idle list keeps
// KeyOrder's idle lanes in their partitions' maps, so that in steady state
// a record costs no allocation for them and a key that comes back finds
// its lane. They are bounded two ways. They only use the room the records
// leave under the global limit: a task or lane is kept only while the
// runner's claim plus what they hold (freeBytes) stays within pauseAt, and
// after a hand-over that pushed the two above it they give back the excess
// (fitFree), so that together they stay within the runner's share as the
// records alone do. And every tick (trimMemory) they give back what no one
// took from them since the last tick, so an idle runner keeps none after a
// peak.

// newTask returns a task from the free list, or a new one.
func (s *pollState) newTask() *task {
	n := len(s.free)
	if n == 0 {
		return &task{}
	}
	t := s.free[n-1]
	s.free[n-1] = nil
	s.free = s.free[:n-1]
	s.freeLow = min(s.freeLow, n-1)
	s.freeBytes -= taskAlloc
	return t
}

// freeTask clears t and keeps it for reuse if the room under the global
// limit allows.
func (s *pollState) freeTask(t *task) {
	*t = task{}
	if s.claimed()+s.freeBytes+taskAlloc <= s.pauseAt {
		s.free = append(s.free, t)
		s.freeBytes += taskAlloc
	}
}

func (s *pollState) newLane(ps *partState, key uint64) *lane {
	n := len(s.freeLanes)
	if n == 0 {
		return &lane{key: key, ps: ps}
	}
	l := s.freeLanes[n-1]
	s.freeLanes[n-1] = nil
	s.freeLanes = s.freeLanes[:n-1]
	s.freeLanesLow = min(s.freeLanesLow, n-1)
	s.freeBytes -= laneAlloc
	l.key, l.ps = key, ps
	return l
}

// freeLane is freeTask for lanes.
func (s *pollState) freeLane(l *lane) {
	*l = lane{}
	if s.claimed()+s.freeBytes+laneAlloc <= s.pauseAt {
		s.freeLanes = append(s.freeLanes, l)
		s.freeBytes += laneAlloc
	}
}

// fitFree gives back free tasks, then free lanes, then the oldest idle
// lanes, until the runner's claim plus freeBytes are within pauseAt again
// (or nothing is left to give back). Each one given back was kept before:
// amortized O(1).
func (s *pollState) fitFree() {
	for over := s.claimed() + s.freeBytes - s.pauseAt; over > 0 && len(s.free) > 0; over -= taskAlloc {
		s.free = trim(s.free, 1)
		s.freeBytes -= taskAlloc
	}
	for over := s.claimed() + s.freeBytes - s.pauseAt; over > 0 && len(s.freeLanes) > 0; over -= laneAlloc {
		s.freeLanes = trim(s.freeLanes, 1)
		s.freeBytes -= laneAlloc
	}
	for s.idleN > 0 && s.claimed()+s.freeBytes > s.pauseAt {
		s.evictIdle(false)
	}
	s.freeLow, s.freeLanesLow = min(s.freeLow, len(s.free)), min(s.freeLanesLow, len(s.freeLanes))
}

// trimMemory is the tick's memory trimming: the free lists, the idle lanes
// and the tracker rings give back what was not used since the last tick.
func (s *pollState) trimMemory() {
	s.trimFree()
	s.trimIdle()
	s.trimRings()
}

// trimFree gives back the tasks and lanes that stayed in the free lists
// since the last call (their least length meanwhile), and the lists'
// arrays once they are mostly empty.
func (s *pollState) trimFree() {
	s.free = trim(s.free, s.freeLow)
	s.freeLanes = trim(s.freeLanes, s.freeLanesLow)
	s.freeLow, s.freeLanesLow = len(s.free), len(s.freeLanes)
	s.freeBytes = int64(len(s.free))*taskAlloc + int64(len(s.freeLanes))*laneAlloc + int64(s.idleN)*laneCharge
}

// trim drops the last k elements of s, and s's array once it is mostly
// unused.
func trim[T any](s []*T, k int) []*T {
	n := len(s) - k
	clear(s[n:])
	s = s[:n]
	if cap(s) > 4*n+64 {
		s = append([]*T(nil), s...)
	}
	return s
}

// KeyOrder's idle lanes. A lane whose last record finished stays in its
// partition's map, so that its key finds it when it comes back (no lane
// allocated, no map entry written), and joins the runner's idle list,
// newest first. The list keeps at most as many lanes as records were
// buffered and in flight at once over the last two tick intervals
// (idleCap: the working set, so a stream of keys that never come back
// costs no more than its records did), in the room under the global limit
// (charged in freeBytes at laneCharge: the lane and its map entry). Beyond
// either, the oldest idle lane leaves its map for the free list (fitIdle),
// where the next new key takes it. So a steady workload allocates no lane,
// whether its keys come back or not, and after two idle ticks no idle lane
// is left.

// pushIdle puts l, a KeyOrder lane that just went idle, at the newest end
// of the idle list. The caller calls fitIdle.
func (s *pollState) pushIdle(l *lane) {
	l.newer, l.older = nil, s.idleNewest
	if s.idleNewest != nil {
		s.idleNewest.newer = l
	} else {
		s.idleOldest = l
	}
	s.idleNewest = l
	s.idleN++
	s.freeBytes += laneCharge
}

// unlinkIdle takes l out of the idle list; it stays in its map.
func (s *pollState) unlinkIdle(l *lane) {
	if l.newer != nil {
		l.newer.older = l.older
	} else {
		s.idleNewest = l.older
	}
	if l.older != nil {
		l.older.newer = l.newer
	} else {
		s.idleOldest = l.newer
	}
	l.newer, l.older = nil, nil
	s.idleN--
	s.freeBytes -= laneCharge
}

// evictIdle takes the oldest idle lane out of the idle list and its map,
// and keeps it in the free list if keep (and the room allows).
func (s *pollState) evictIdle(keep bool) {
	l := s.idleOldest
	s.unlinkIdle(l)
	ps := l.ps
	delete(ps.lanes, l.key)
	s.shrinkLanes(ps)
	if keep {
		s.freeLane(l)
	}
}

// idleCap is the most idle lanes the list keeps: the most records buffered
// and in flight at once since the tick before the last.
func (s *pollState) idleCap() int { return max(s.countPeak, s.countPrev) }

// fitIdle evicts the oldest idle lanes, to the free list, while the list is
// above idleCap or the runner's claim and freeBytes are above pauseAt. Each
// eviction undoes one pushIdle: amortized O(1).
func (s *pollState) fitIdle() {
	for s.idleN > 0 && (s.idleN > s.idleCap() || s.claimed()+s.freeBytes > s.pauseAt) {
		s.evictIdle(true)
	}
}

// trimIdle runs every tick: the cap moves on by one interval, and the idle
// lanes above it are given back (not kept in the free list: they stayed
// idle while the records were fewer).
func (s *pollState) trimIdle() {
	s.countPrev, s.countPeak = s.countPeak, s.totalCount
	for s.idleN > s.idleCap() {
		s.evictIdle(false)
	}
}

// shrinkLanes rebuilds ps's lane map once evictions left it less than half
// as full as it once was: a Go map never gives back its table. A rebuild of
// n lanes comes after at least n evictions since the last one: amortized
// O(1).
func (s *pollState) shrinkLanes(ps *partState) {
	n := len(ps.lanes)
	if ps.lanePeak <= 2*n || ps.lanePeak <= laneMapMin {
		return
	}
	m := make(map[uint64]*lane, n)
	for k, l := range ps.lanes {
		m[k] = l
	}
	ps.lanes, ps.lanePeak = m, n
}

// setRing charges ps's tracker ring at its size beyond the least ring
// (PartitionOverhead covers that one), and counts its whole size in
// ringReal. It runs after a hand-over, which can grow the ring, and after
// the tick trimmed it; nothing else changes the ring's size.
func (s *pollState) setRing(ps *partState) {
	size := ps.p.Tracker().RingBytes()
	if size == ps.ringReal {
		return
	}
	c := max(size-watermark.MinRingBytes, 0)
	s.ringBytes += c - ps.ringBytes
	s.ringReal += size - ps.ringReal
	ps.ringBytes, ps.ringReal = c, size
}

// trimRings shrinks the tracker rings to what their partitions used since
// the last tick but one (watermark.Tracker.Trim). It runs every tick, over
// the owned partitions as publishStats does: O(1) for a partition whose
// ring keeps its size. So a burst of records does not reallocate the ring
// (Complete never shrinks it), and an idle partition keeps only the least
// ring after two ticks. When a ring shrank it re-checks the global limit:
// the rings may be all that kept the runner paused, and once every record
// finished nothing else would resume it.
func (s *pollState) trimRings() {
	shrunk := false
	for _, ps := range s.parts {
		if ps.p.Tracker().Trim() {
			s.setRing(ps)
			shrunk = true
		}
	}
	if shrunk {
		s.checkGlobal()
	}
}

// release ends what a closed partition charges: its tracker ring, its held
// lanes and its idle ones, which leave the idle list for the free list.
// Its tracker keeps no ring (the partition's next assignment starts afresh
// anyway); in-flight records are charged until they return. It is
// O(lanes), as the drain before it.
func (s *pollState) release(ps *partState) {
	s.heldBytes -= int64(ps.held) * laneCharge
	ps.held = 0
	for _, l := range ps.lanes {
		if !l.busy {
			s.unlinkIdle(l)
			s.freeLane(l)
		}
	}
	ps.lanes = nil
	ps.p.Tracker().Reset(ps.p.Safe())
	s.setRing(ps)
}

// charged is the runner's total charge: what MaxBufferedBytes bounds.
func (s *pollState) charged() int64 { return s.totalBytes + s.ringBytes + s.heldBytes }

// claimed is what the global limit compares with pauseAt: the charge and
// ringReal, the most that the next hand-over can grow the tracker rings by
// beyond two slots per record it brings. A ring grows only when full, by
// doubling: from L slots holding n <= L records, k more take it to less than
// 2(n+k) slots, so it grows by less than L + 2k slots.
func (s *pollState) claimed() int64 { return s.charged() + s.ringReal }

// globalLimits returns where the runner pauses every partition (its
// claim at pauseAt or above) for MaxBufferedBytes max: its share, max
// minus SourceShare, less what one hand-over can add (the check runs after
// it). A hand-over brings at most SourceShare of key, value and header bytes
// (the source holds them before handing them over; the allocator rounds a
// copy up by at most a quarter plus 7 bytes) and at most high-low records
// (the runner's budget), each charged at most RecordOverhead plus 8 bytes of
// rounding and one header of slice rounding, and growing its tracker ring
// by at most two slots beyond ringReal (claimed). The free lists live under
// pauseAt too (freeTask). pauseAt is not positive when max leaves no room.
func (c *config) globalLimits() (pauseAt, handover int64) {
	share := int64(float64(c.maxBytes) * SourceShare)
	perRecord := RecordOverhead(c.ordering) + 8 + headerSize + 2*watermark.SlotSize
	if c.batched {
		perRecord += batchRecordOverhead
	}
	handover = share + share/4 + int64(c.highRecords-c.lowRecords)*perRecord
	return c.maxBytes - share - handover, handover
}
