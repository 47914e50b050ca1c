package rebalance

import (
	"errors"
	"strconv"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// TP names a topic partition.
type TP struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TP) String() string { return tp.Topic + "/" + strconv.FormatInt(int64(tp.Partition), 10) }

// Epoch identifies one assignment of one partition to this consumer. It is
// a local counter, strictly increasing across a [Table], and never the Kafka
// generation id. The zero Epoch means "none".
type Epoch uint64

// Outcome classifies a completion notice.
type Outcome uint8

const (
	// Advanced means the completion moved the safe offset.
	Advanced Outcome = iota + 1
	// Recorded means the completion was stored, but an earlier delivered
	// record is unfinished.
	Recorded
	// Duplicate means the offset is below the safe offset or already
	// completed in this epoch.
	Duplicate
	// UnknownOffset means the offset was not delivered in this epoch.
	UnknownOffset
	// OldAssignment means the completion carries an epoch that is not the
	// partition's current one; it is dropped and counted.
	OldAssignment
	// NotOwner means the partition is not owned (never assigned, revoked or
	// lost); the completion is dropped and counted.
	NotOwner
)

// String returns "advanced", "recorded", "duplicate", "unknown-offset",
// "old-assignment" or "not-owner".
func (o Outcome) String() string {
	switch o {
	case Advanced, Recorded, Duplicate, UnknownOffset:
		return watermark.Outcome(o).String()
	case OldAssignment:
		return "old-assignment"
	case NotOwner:
		return "not-owner"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// The first four outcomes convert from watermark.Outcome by value; these
// constant indexes fail to compile if the two lists ever drift apart.
var _ = [1]struct{}{}[Advanced-Outcome(watermark.Advanced)]
var _ = [1]struct{}{}[Recorded-Outcome(watermark.Recorded)]
var _ = [1]struct{}{}[Duplicate-Outcome(watermark.Duplicate)]
var _ = [1]struct{}{}[UnknownOffset-Outcome(watermark.UnknownOffset)]

// ErrNotOwned is matched (with errors.Is) by a [*DeliveryError] for a
// partition that is not owned.
var ErrNotOwned = errors.New("rebalance: partition not owned")

// ErrEpochOrder is matched (with errors.Is) by every [*EpochError].
var ErrEpochOrder = errors.New("rebalance: epoch not increasing")

// DeliveryError reports a delivery that [Partition.Deliver] refused.
type DeliveryError struct {
	// TP is the partition.
	TP TP
	// Offset is the refused offset.
	Offset int64
	// Err is [ErrNotOwned] or the tracker's error (a *watermark.OrderError
	// or watermark.ErrInvalidOffset).
	Err error
}

// Error names the record (topic/partition@offset) and the reason.
func (e *DeliveryError) Error() string {
	return "rebalance: deliver " + e.TP.String() + "@" + strconv.FormatInt(e.Offset, 10) + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *DeliveryError) Unwrap() error { return e.Err }

// EpochError reports an explicit epoch that is not above the table's last.
type EpochError struct {
	// TP is the partition being assigned.
	TP TP
	// Epoch is the refused epoch.
	Epoch Epoch
	// Last is the table's last epoch.
	Last Epoch
}

// Error names the partition and both epochs.
func (e *EpochError) Error() string {
	return "rebalance: assign " + e.TP.String() + " epoch " + strconv.FormatUint(uint64(e.Epoch), 10) +
		": epochs must increase, last was " + strconv.FormatUint(uint64(e.Last), 10)
}

// Is reports whether target is [ErrEpochOrder].
func (e *EpochError) Is(target error) bool { return target == ErrEpochOrder }

// Table is the ownership table of a consumer's partitions. The zero Table
// is not ready: use [NewTable]. A Table is not safe for concurrent use.
type Table struct {
	byTP  map[TP]*Partition
	order []*Partition // every partition ever assigned, in first-assignment order
	last  Epoch
	// dirty holds, once each, the partitions whose commit request may have
	// changed since the last Pending: their safe offset moved (or became
	// known), or their request in flight failed. Pending looks at these
	// only, so its cost follows the partitions that changed, not the
	// partitions ever assigned.
	dirty []*Partition

	oldAssignment uint64
	notOwner      uint64
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{byTP: make(map[TP]*Partition)}
}

// Assign records that tp is (re)assigned, starting at start (the committed
// offset, or watermark.Unknown if not fetched yet). It gives tp a new epoch,
// one above the table's last, and a fresh tracker from start. If tp is still
// owned, its old epoch ends first (a rejoin with the same partitions). The
// returned *Partition is the same for every assignment of tp; its buffers are
// reused.
//
// A known start is the broker's word on the committed offset and replaces the
// acknowledged boundary (see [watermark.Sequencer.Reset]); an Unknown start
// keeps the acknowledged boundary of the previous assignment, so nothing at
// or below it is sent again. Either way answers to commits sent before the
// assignment are ignored.
func (t *Table) Assign(tp TP, start int64) *Partition {
	p, _ := t.AssignEpoch(tp, t.last+1, start)
	return p
}

// AssignEpoch is Assign with an explicit epoch (the lab replays scripts
// with their own epochs). It returns an [*EpochError] and changes nothing if
// epoch is not above the table's last epoch.
func (t *Table) AssignEpoch(tp TP, epoch Epoch, start int64) (*Partition, error) {
	if epoch <= t.last {
		return nil, &EpochError{TP: tp, Epoch: epoch, Last: t.last}
	}
	t.last = epoch
	p := t.byTP[tp]
	if p == nil {
		p = &Partition{tp: tp, table: t}
		t.byTP[tp] = p
		t.order = append(t.order, p)
	}
	p.epoch, p.owned = epoch, true
	p.tracker.Reset(start)
	if start >= 0 {
		p.seq.Reset(start)
	} else {
		p.seq.Reset(p.seq.Acknowledged())
	}
	p.changed()
	return p, nil
}

// Lookup returns tp's partition, owned or not, or nil if tp was never
// assigned.
func (t *Table) Lookup(tp TP) *Partition { return t.byTP[tp] }

// Complete classifies a completion for tp under epoch; see
// [Partition.Complete]. A tp never assigned is [NotOwner] (counted).
func (t *Table) Complete(tp TP, epoch Epoch, offset int64) Outcome {
	p := t.byTP[tp]
	if p == nil {
		t.notOwner++
		return NotOwner
	}
	return p.Complete(epoch, offset)
}

// Revoke ends tp's epoch after a normal revoke and returns the final offset
// to commit: the safe offset (watermark.Unknown if the start never became
// known; commit nothing then). ok is false, and nothing changes, if tp is not
// owned. The caller stops dispatch and drains within its budget before
// calling Revoke; completions that arrive later are [NotOwner].
//
// Revoke sends nothing through the partition's sequencer. To commit the final
// offset as a sequenced request, so that Acknowledged stays exact, take the
// partition's [Partition.Pending] commit before calling Revoke (after the
// drain it carries the final offset; false means that offset is already
// acknowledged or in flight) and answer it with Committed or CommitFailed,
// which remain valid after Revoke.
func (t *Table) Revoke(tp TP) (final int64, ok bool) {
	p := t.byTP[tp]
	if p == nil || !p.owned {
		return watermark.Unknown, false
	}
	p.owned = false
	return p.tracker.Safe(), true
}

// Lose ends tp's epoch after ownership was lost (or may have been): nothing
// may be committed for it (invariant 4). It reports whether tp was owned.
func (t *Table) Lose(tp TP) bool {
	p := t.byTP[tp]
	if p == nil || !p.owned {
		return false
	}
	p.owned = false
	return true
}

// Owned appends the owned partitions to dst, in the order they were first
// assigned, and returns the extended slice.
func (t *Table) Owned(dst []*Partition) []*Partition {
	for _, p := range t.order {
		if p.owned {
			dst = append(dst, p)
		}
	}
	return dst
}

// Stale returns how many completions were dropped as [OldAssignment] and as
// [NotOwner] (invariant 3), over the table's life.
func (t *Table) Stale() (oldAssignment, notOwner uint64) { return t.oldAssignment, t.notOwner }

// Commit is one commit request for one partition.
type Commit struct {
	// TP is the partition.
	TP TP
	// Epoch is the assignment the offset was computed in.
	Epoch Epoch
	// Seq identifies the request to the partition's sequencer.
	Seq uint64
	// Offset is the offset to commit.
	Offset int64
}

// Pending appends to dst one Commit for each owned partition whose safe
// offset is known and beyond what was acknowledged or is in flight (see
// [watermark.Sequencer.Next]), marks those requests in flight, and returns the
// extended slice. Partitions that are not owned are never offered. Every
// returned Commit must be answered with Committed or CommitFailed. Its cost
// is O(partitions that changed since the last call): it looks only at
// partitions whose safe offset moved, or whose request failed, meanwhile.
func (t *Table) Pending(dst []Commit) []Commit {
	for _, p := range t.dirty {
		p.dirty = false
		if c, ok := p.Pending(); ok {
			dst = append(dst, c)
		}
	}
	clear(t.dirty)
	t.dirty = t.dirty[:0]
	return dst
}

// Committed records that the broker acknowledged c. It is valid after c's
// partition was revoked or lost; an answer older than the partition's current
// assignment, or older than an answer already recorded, never lowers the
// acknowledged boundary.
func (t *Table) Committed(c Commit) {
	if p := t.byTP[c.TP]; p != nil {
		p.seq.Acked(watermark.Request{Seq: c.Seq, Offset: c.Offset})
	}
}

// CommitFailed records that c failed or that its outcome is unknown. Neither
// boundary changes; the next Pending offers the newest safe offset again.
func (t *Table) CommitFailed(c Commit) {
	if p := t.byTP[c.TP]; p != nil {
		p.seq.Failed(watermark.Request{Seq: c.Seq, Offset: c.Offset})
		p.changed() // the newest safe offset is to be sent again
	}
}

// Partition is the state of one partition in a [Table]: ownership, epoch,
// tracker and commit sequencer. The pointer stays valid, and is reused by
// later assignments, for the table's life. Like the table, it is not safe for
// concurrent use.
type Partition struct {
	tp      TP
	table   *Table
	epoch   Epoch
	owned   bool
	dirty   bool // in table.dirty
	tracker watermark.Tracker
	seq     watermark.Sequencer
}

// changed puts p on its table's list for the next Pending.
func (p *Partition) changed() {
	if !p.dirty {
		p.dirty = true
		p.table.dirty = append(p.table.dirty, p)
	}
}

// TP returns the partition's name.
func (p *Partition) TP() TP { return p.tp }

// Epoch returns the current epoch, or the last one if the partition is not
// owned.
func (p *Partition) Epoch() Epoch { return p.epoch }

// Owned reports whether the partition is owned (assigned, and neither
// revoked nor lost since).
func (p *Partition) Owned() bool { return p.owned }

// Deliver records that the record at offset was handed to the application in
// the current epoch. It returns a [*DeliveryError] naming the record, wrapping
// [ErrNotOwned] if the partition is not owned, or the tracker's error (see
// [watermark.Tracker.Deliver]).
func (p *Partition) Deliver(offset int64) error {
	if !p.owned {
		return &DeliveryError{TP: p.tp, Offset: offset, Err: ErrNotOwned}
	}
	unknown := p.tracker.Safe() == watermark.Unknown
	if err := p.tracker.Deliver(offset); err != nil {
		return &DeliveryError{TP: p.tp, Offset: offset, Err: err}
	}
	if unknown {
		p.changed() // the first delivery gave an Unknown start its value
	}
	return nil
}

// Complete classifies a completion for the record at offset dispatched under
// epoch: [NotOwner] if the partition is not owned, [OldAssignment] if epoch
// is not the current one (both counted in the table's Stale and changing
// nothing else), and otherwise the tracker's outcome.
func (p *Partition) Complete(epoch Epoch, offset int64) Outcome {
	if !p.owned {
		p.table.notOwner++
		return NotOwner
	}
	if epoch != p.epoch {
		p.table.oldAssignment++
		return OldAssignment
	}
	o := Outcome(p.tracker.Complete(offset))
	if o == Advanced {
		p.changed()
	}
	return o
}

// Position passes the fetcher's position for the current epoch to the
// tracker (see [watermark.Tracker.Position]) and reports whether the safe
// offset moved. It does nothing and returns false if the partition is not
// owned or epoch is not the current one.
func (p *Partition) Position(epoch Epoch, pos int64) bool {
	if !p.owned || epoch != p.epoch {
		return false
	}
	moved := p.tracker.Position(pos)
	if moved {
		p.changed()
	}
	return moved
}

// Safe returns the safe offset of the current (or last) epoch, or
// watermark.Unknown. After a revoke or loss it keeps its last value until the
// next assignment.
func (p *Partition) Safe() int64 { return p.tracker.Safe() }

// Acknowledged returns the highest offset the broker confirmed for this
// partition, or the start of the current assignment (see [Table.Assign]), or
// watermark.Unknown.
func (p *Partition) Acknowledged() int64 { return p.seq.Acknowledged() }

// Pending returns the commit request to send now for this partition, and
// marks it in flight: false if the partition is not owned, its safe offset is
// not known, or there is nothing new to send (see
// [watermark.Sequencer.Next]). Answer it with Table.Committed or
// Table.CommitFailed.
func (p *Partition) Pending() (Commit, bool) {
	if !p.owned {
		return Commit{}, false
	}
	safe := p.tracker.Safe()
	if safe == watermark.Unknown {
		return Commit{}, false
	}
	r, ok := p.seq.Next(safe)
	if !ok {
		return Commit{}, false
	}
	return Commit{TP: p.tp, Epoch: p.epoch, Seq: r.Seq, Offset: r.Offset}, true
}

// Tracker returns the partition's tracker for reading (Outstanding, Oldest,
// At, ...). Calling its mutating methods directly bypasses epoch fencing.
func (p *Partition) Tracker() *watermark.Tracker { return &p.tracker }
