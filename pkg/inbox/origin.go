package inbox

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/tidemark/tidemark/pkg/runner"
)

// A redriven dead letter (`tidemark dlt replay`) is a new record, at a new
// offset, of the same event as the record first consumed: its origin,
// which the dead letter's runner.HeaderOriginTopic, HeaderOriginPartition
// and HeaderOriginOffset headers name (the first origin, however often it
// was dead-lettered). Its own inbox row says nothing of the origin, so the
// Store also claims an origin row: an inbox row at the origin's
// coordinates, in the same transaction. If the origin already has a row
// — the origin record was applied after all (its dead-lettering followed
// a failure after the commit), or an earlier redrive of it was — the
// claim finds it and the record is a replay. Otherwise the effect runs,
// and the origin row commits with it, so a second redrive, or the origin
// record consumed again after an offset reset, is a replay too.
//
// Fencing: the redriven record's own row is written under the lease of
// the partition it came from and is fenced as any row; the origin row is
// in the same transaction and commits only with it, so the fence trigger
// does not check it against the origin partition's lease (which another
// member may hold). See migration 3.
//
// Retention: the origin partition's retention prunes origin rows like its
// other rows, and raises its applied mark past them. An origin offset
// below that mark with no row left cannot be decided: its row may have
// been pruned (applied) or never written (dead-lettered), and the mark
// does not say which. The Store refuses such a record with an
// *OriginBelowMarkError, which is runner.Permanent: applying it might apply
// an effect twice, and taking it for a replay would drop the very records a
// redrive is for, since the group's committed offset — and retention's
// bound with it — passes a dead-lettered record at once.

// origin is the record a redriven dead letter came from.
type origin struct {
	topic     string
	partition int32
	offset    int64
}

func (o *origin) String() string {
	return o.topic + "/" + strconv.FormatInt(int64(o.partition), 10) + "@" + strconv.FormatInt(o.offset, 10)
}

// key is the origin's identity among a batch's dedup keys (see take): no
// dedup key digest can be it.
func (o *origin) key() string { return "\x00origin\x00" + o.String() }

// originOf returns the origin rec names in its headers, nil when it names
// none (or itself), and a runner.Permanent error when its origin headers
// are incomplete or malformed: they will be the same on every attempt.
func originOf(rec *runner.Record) (*origin, error) {
	o, ok, err := runner.OriginOf(rec.Headers)
	if err != nil {
		// No record came from it, and it is the same on every attempt; a
		// topic name that is not UTF-8 or holds a NUL would also fail, in
		// PostgreSQL, the claim of every record sharing the transaction.
		return nil, runner.Permanent(fmt.Errorf("inbox: %s: %w: %v", rec.String(), ErrBadOrigin, err))
	}
	if !ok || o.Topic == rec.Topic && o.Partition == rec.Partition && o.Offset == rec.Offset {
		return nil, nil // none, or the record is its own origin: its own row is the one
	}
	return &origin{topic: o.Topic, partition: o.Partition, offset: o.Offset}, nil
}

// ErrBadOrigin is returned, wrapped with the record and marked
// runner.Permanent, by a Store's handlers for a record whose
// tidemark-origin-* headers are present but incomplete or malformed.
var ErrBadOrigin = errors.New("inbox: malformed origin headers")

// OriginBelowMarkError is returned by a Store's handlers for a redriven
// dead letter whose origin offset is below its partition's applied mark
// and whose origin row retention has pruned, or never had: the inbox cannot
// tell whether the origin was applied. The effect was not run and nothing
// was written. It is marked runner.Permanent (errors.As finds a
// *runner.PermanentError), so a DeadLetter policy writes the record to the
// dead-letter topic again at once, with its first origin. Keep the origin
// partition's rows for as long as you may redrive its dead letters
// (RetainFor) to avoid it; docs/inbox.md ("Redrive") says why the inbox
// refuses rather than guesses.
type OriginBelowMarkError struct {
	Record string // the redriven record, topic/partition@offset
	Origin string // its origin, topic/partition@offset
}

func (e *OriginBelowMarkError) Error() string {
	return fmt.Sprintf("inbox: %s is a redrive of %s, which is below its partition's applied mark: retention pruned the rows there, so whether it was applied is unknown; not applied (keep the origin partition's rows longer with RetainFor to redrive later)",
		e.Record, e.Origin)
}

// Unwrap returns the runner.Permanent mark.
func (e *OriginBelowMarkError) Unwrap() error { return &runner.PermanentError{Err: errOriginBelowMark} }

var errOriginBelowMark = errors.New("inbox: origin below the applied mark")

// originState is what a claim learned of a redriven record's origin.
type originState uint8

const (
	originNone    originState = iota // no origin, or the record's own row was not claimed
	originClaimed                    // its origin row is in: apply the effect
	originApplied                    // its origin has a row: a replay
	originBelow                      // below the origin's applied mark, no row: undecidable
)
