package watermark

import (
	"errors"
	"math"
	"math/bits"
	"strconv"
	"unsafe"
)

// Unknown is the start offset of an assignment whose committed offset is not
// yet known (franz-go reports an assignment before it has fetched the
// committed offsets). A [Tracker] created with Unknown takes its start from
// the first [Tracker.Deliver] or [Tracker.Position]. Safe, Start and
// Acknowledged report Unknown while they have no value.
const Unknown int64 = -1

// Outcome classifies a completion notice.
type Outcome uint8

const (
	// Advanced means the completion moved the safe offset.
	Advanced Outcome = iota + 1
	// Recorded means the completion was stored, but an earlier delivered
	// record is unfinished, so the safe offset did not move.
	Recorded
	// Duplicate means the offset is below the safe offset, or was already
	// completed in this assignment. Nothing changed.
	Duplicate
	// UnknownOffset means the offset was not delivered in this assignment
	// (an integer in a gap, beyond the last delivered offset, or nothing
	// delivered yet). Nothing changed.
	UnknownOffset
)

// String returns "advanced", "recorded", "duplicate" or "unknown-offset".
func (o Outcome) String() string {
	switch o {
	case Advanced:
		return "advanced"
	case Recorded:
		return "recorded"
	case Duplicate:
		return "duplicate"
	case UnknownOffset:
		return "unknown-offset"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// ErrOutOfOrder is matched (with errors.Is) by every [*OrderError].
var ErrOutOfOrder = errors.New("watermark: offset delivered out of order")

// ErrInvalidOffset is returned by [Tracker.Deliver] for an offset outside
// [0, math.MaxInt64): a negative offset is not a Kafka offset, and the
// largest int64 has no next offset to commit.
var ErrInvalidOffset = errors.New("watermark: invalid offset")

// OrderError reports an offset that [Tracker.Deliver] refused because it
// would break delivery order: it is not above the previous delivered offset,
// or it is below the safe offset (the start, or a position the tracker has
// moved to). Committing past it would be unsafe, so it is never stored.
type OrderError struct {
	// Offset is the refused offset.
	Offset int64
	// Last is the previous delivered offset of this assignment, or Unknown.
	Last int64
	// Safe is the safe offset when the offset was refused.
	Safe int64
}

// Error names both offsets.
func (e *OrderError) Error() string {
	if e.Last != Unknown && e.Offset <= e.Last {
		return "watermark: offset " + strconv.FormatInt(e.Offset, 10) +
			" delivered after " + strconv.FormatInt(e.Last, 10) +
			": delivered offsets must strictly increase"
	}
	return "watermark: offset " + strconv.FormatInt(e.Offset, 10) +
		" delivered below the safe offset " + strconv.FormatInt(e.Safe, 10)
}

// Is reports whether target is [ErrOutOfOrder].
func (e *OrderError) Is(target error) bool { return target == ErrOutOfOrder }

// slot is one delivered record in the ring.
type slot struct {
	off  int64
	done bool
}

// minRing is the capacity of the ring at its first growth, and the least
// it shrinks to.
const minRing = 16

// SlotSize is what one slot of a [Tracker]'s ring takes, in bytes, and
// MinRingBytes what its least ring takes: [Tracker.RingBytes] is a multiple
// of SlotSize, and MinRingBytes or more once a record was delivered.
const (
	SlotSize     = 16
	MinRingBytes = 256
)

// The two constants are written out so that they stay untyped; these
// constant indexes fail to compile if the slot's size ever changes.
var _ = [1]struct{}{}[SlotSize-unsafe.Sizeof(slot{})]
var _ = [1]struct{}{}[MinRingBytes-minRing*unsafe.Sizeof(slot{})]

// Tracker follows one partition in one assignment: the offsets delivered to
// the application, in delivery order, and which of them are complete. The
// safe offset is one past the last offset of the contiguous completed prefix
// of delivered records, or the start offset before any.
//
// Delivered records sit in a ring buffer in delivery order; the head leaves
// the ring while it is complete. Each call is amortized O(1) (finding a
// completion's slot is O(1) when the outstanding offsets have no gaps, see
// find). The ring doubles when full and only [Tracker.Trim] shrinks it, so
// a burst of records that fills and empties the ring does not reallocate
// it; called periodically (the runner does on every tick), Trim makes the
// ring's memory follow the outstanding records, not their peak. The ring
// holds at most max(16, p) slots, p the least power of two at or above
// twice the most records outstanding at once since the last Trim but one
// (since New or Reset while there were fewer than two Trims);
// [Tracker.RingBytes] reports what it takes. A window that stays within one
// size allocates nothing. [Tracker.Reset] releases the ring.
//
// The zero Tracker is ready to use and behaves as New(Unknown). A Tracker is
// not safe for concurrent use: the runner's poll goroutine owns it.
type Tracker struct {
	started bool  // start and safe are known
	start   int64 // the assignment's start offset, if started
	safe    int64 // the safe offset, if started
	next    int64 // one past the last delivered offset; 0 when none (so next-1 is Unknown)

	ring []slot // len is 0 or a power of two, at least minRing
	head int    // ring index of the oldest outstanding record
	n    int    // outstanding records: ring[head], ..., ring[head+n-1] (mod len)
	peak int    // the most records outstanding since the last Trim (or Reset)
}

// New returns a tracker for an assignment that starts at start, the offset
// the group has committed (where consumption resumes). A negative start,
// such as Unknown, means not yet known.
func New(start int64) *Tracker {
	t := new(Tracker)
	t.Reset(start)
	return t
}

// Reset forgets everything and starts a new assignment at start, as New
// does. It releases the ring: the new assignment allocates one of the least
// size on its first delivery, and the tracker of an assignment that ended
// holds nothing.
func (t *Tracker) Reset(start int64) {
	t.head, t.n, t.next, t.ring, t.peak = 0, 0, 0, nil, 0
	if start < 0 {
		t.started, t.start, t.safe = false, Unknown, Unknown
		return
	}
	t.started, t.start, t.safe = true, start, start
}

// Deliver records that the record at offset was handed to the application.
// Offsets must strictly increase within an assignment and be at least the
// safe offset (so at least the start, and at least any position the safe
// offset moved to); otherwise Deliver returns an [*OrderError] (matching
// [ErrOutOfOrder]) and stores nothing. Gaps between offsets are normal. If
// the start is Unknown, the first delivered offset becomes the start.
func (t *Tracker) Deliver(offset int64) error {
	if offset < 0 || offset == math.MaxInt64 {
		return &invalidOffsetError{offset}
	}
	if offset < t.next || (t.started && offset < t.safe) {
		return &OrderError{Offset: offset, Last: t.next - 1, Safe: t.Safe()}
	}
	if !t.started {
		t.started, t.start, t.safe = true, offset, offset
	}
	if t.n == len(t.ring) {
		t.grow()
	}
	t.ring[(t.head+t.n)&(len(t.ring)-1)] = slot{off: offset}
	t.n++
	t.peak = max(t.peak, t.n)
	t.next = offset + 1
	return nil
}

// grow doubles the ring (or creates it).
func (t *Tracker) grow() { t.resize(max(minRing, 2*len(t.ring))) }

// resize moves the outstanding records to a new ring of size (a power of
// two, at least n), unwrapping it so the head is at 0.
func (t *Tracker) resize(size int) {
	ring := make([]slot, size)
	if t.n > 0 {
		if end := t.head + t.n; end <= len(t.ring) {
			copy(ring, t.ring[t.head:end])
		} else {
			k := copy(ring, t.ring[t.head:])
			copy(ring[k:t.n], t.ring[:end-len(t.ring)])
		}
	}
	t.ring, t.head = ring, 0
}

// Trim gives back the ring's capacity that was not used since the last
// Trim: it shrinks the ring to the least power of two at or above twice the
// most records outstanding at once since then (at least 16 slots), when
// that is smaller. Deliver and Complete never shrink the ring; call Trim
// periodically so that its memory follows the outstanding records (the
// runner calls it on every tick, for each partition). Trim is O(1) when it
// keeps the ring and O(Outstanding()) when it shrinks it; it reports
// whether it did, so the caller can account for the ring's new
// [Tracker.RingBytes].
func (t *Tracker) Trim() (shrunk bool) {
	size := minRing
	if m := 2 * t.peak; m > minRing {
		size = 1 << bits.Len(uint(m-1))
	}
	t.peak = t.n
	if t.ring == nil || size >= len(t.ring) {
		return false
	}
	t.resize(size)
	return true
}

// RingBytes returns what the ring takes: SlotSize bytes a slot, none after
// New or Reset until a record is delivered, MinRingBytes at least then.
func (t *Tracker) RingBytes() int64 { return int64(len(t.ring)) * SlotSize }

// Complete records that the record at offset finished and classifies the
// notice. Only an offset delivered in this assignment and not yet complete
// changes anything: it returns [Advanced] if the safe offset moved and
// [Recorded] otherwise. An offset below the safe offset, or completed
// before, is a [Duplicate]; any other offset is an [UnknownOffset].
func (t *Tracker) Complete(offset int64) Outcome {
	if t.n == 0 || offset >= t.next {
		if t.started && offset < t.safe {
			return Duplicate
		}
		return UnknownOffset
	}
	if offset < t.safe {
		return Duplicate
	}
	k, ok := t.find(offset)
	if !ok {
		return UnknownOffset
	}
	mask := len(t.ring) - 1
	s := &t.ring[(t.head+k)&mask]
	if s.done {
		return Duplicate
	}
	s.done = true
	if k != 0 {
		return Recorded
	}
	// The head is complete: it and every complete record behind it leave
	// together, and the safe offset becomes one past the last of them.
	for t.n > 0 && t.ring[t.head].done {
		t.safe = t.ring[t.head].off + 1
		t.head = (t.head + 1) & mask
		t.n--
	}
	return Advanced
}

// find returns the position k (0 is the head) of offset among the
// outstanding records, which must be non-empty with offset in
// [ring[head].off, next).
//
// It uses no index (a map would allocate and hash on every record). Because
// the outstanding offsets strictly increase, each at least one above the one
// before it, the position is bounded on both sides by arithmetic alone:
//
//	k <= offset - first          (at most one slot per integer since the head)
//	k >= (n-1) - (last - offset) (at most one slot per integer up to the tail)
//
// The two bounds meet when the outstanding window has no gaps, the common
// case, so the slot is found in O(1); otherwise a binary search runs between
// them, O(log g) for g missing integers inside the window (and never more
// than O(log n)).
func (t *Tracker) find(offset int64) (int, bool) {
	mask := len(t.ring) - 1
	first := t.ring[t.head].off
	last := t.next - 1
	hi := int(min(int64(t.n-1), offset-first))
	lo := int(max(0, int64(t.n-1)-(last-offset)))
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if t.ring[(t.head+mid)&mask].off < offset {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo > hi || t.ring[(t.head+lo)&mask].off != offset {
		return 0, false
	}
	return lo, true
}

// Position reports the fetcher's position: every record below pos has been
// returned by the fetch and passed to Deliver. When nothing delivered is
// outstanding and pos is beyond the safe offset (the fetch skipped control
// records or compacted offsets), the safe offset moves to pos, so that lag
// reaches zero on transactional topics; Position then returns true. It
// returns false otherwise and does not remember pos: call it again after the
// outstanding records complete (the runner does on every poll).
//
// pos must cover only delivered records: a position past records that are
// still buffered and not yet delivered would let the safe offset skip them.
// If the start is Unknown, pos becomes the start. A negative pos is ignored.
func (t *Tracker) Position(pos int64) bool {
	if pos < 0 {
		return false
	}
	if !t.started {
		t.started, t.start, t.safe = true, pos, pos
		return true
	}
	if t.n > 0 || pos <= t.safe {
		return false
	}
	t.safe = pos
	return true
}

// Safe returns the safe offset: the offset to commit, where a restart would
// resume without losing a delivered record that is not complete. It is
// Unknown until a start is known.
func (t *Tracker) Safe() int64 {
	if !t.started {
		return Unknown
	}
	return t.safe
}

// Start returns the assignment's start offset, or Unknown.
func (t *Tracker) Start() int64 {
	if !t.started {
		return Unknown
	}
	return t.start
}

// Outstanding returns the number of delivered records not yet below the safe
// offset: incomplete, or complete but behind an incomplete one.
func (t *Tracker) Outstanding() int { return t.n }

// Oldest returns the lowest delivered offset that is not complete (the
// record the safe offset waits for, whose age is the "oldest unfinished
// record" metric); ok is false if there is none.
func (t *Tracker) Oldest() (offset int64, ok bool) {
	if t.n == 0 {
		return 0, false
	}
	// The head is never complete: Complete removes complete heads at once.
	return t.ring[t.head].off, true
}

// Last returns the last offset delivered in this assignment, or Unknown.
func (t *Tracker) Last() int64 { return t.next - 1 }

// At returns the i-th outstanding record in delivery order (0 is the oldest)
// and whether it is complete, for inspection (the lab prints the queue with
// it). It panics, like a slice index, unless 0 <= i < Outstanding().
func (t *Tracker) At(i int) (offset int64, completed bool) {
	if i < 0 || i >= t.n {
		panic("watermark: Tracker.At index " + strconv.Itoa(i) + " out of range [0:" + strconv.Itoa(t.n) + "]")
	}
	s := t.ring[(t.head+i)&(len(t.ring)-1)]
	return s.off, s.done
}

// invalidOffsetError reports an offset outside [0, math.MaxInt64).
type invalidOffsetError struct{ offset int64 }

func (e *invalidOffsetError) Error() string {
	return "watermark: invalid offset " + strconv.FormatInt(e.offset, 10) + ": want 0 <= offset < 2^63-1"
}

func (e *invalidOffsetError) Unwrap() error { return ErrInvalidOffset }
