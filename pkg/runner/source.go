package runner

import (
	"context"
	"errors"
	"time"
)

// Source is what the runner needs from a Kafka client: group membership,
// fetching, pausing and committing. Adapters live in pkg/source/...; the
// runner is their only caller.
//
// Run is called once, on its own goroutine. It joins the group and reports
// what happens through the Sink: assignments, revokes, losses and fetched
// records. Every Sink call blocks until the runner has acted on it, so a
// source that reports a revoke inside its client's rebalance callback holds
// the rebalance until the partitions are drained and committed. Run returns
// when ctx is done or after Close, with nil or the fatal error that stopped
// it.
//
// Pause and Resume are called from the runner's poll goroutine, never
// concurrently with each other, and must not block. The runner calls them
// while the source is inside a Sink call: before Fetched returns (it pauses
// the partitions a hand-over brought to their high water mark), before
// Assigned returns (under the global cap new partitions start paused), and
// at any time while Revoked or Lost wait. So a source must not hold, across
// a Sink call, a lock that Pause or Resume take: the runner would wait for
// the source and the source for the runner. They may also run concurrently
// with Run, the client's own goroutines and callbacks, Commit, and
// WriteDeadLetter (called from the runner's workers); never with Close,
// which comes after the last of them. The runner does not resume a
// partition it revokes or loses while paused: a new assignment must start
// unpaused, so the source resumes a partition when it assigns it again.
// Commit is called from the runner's single commit goroutine, never
// concurrently with itself; it commits exactly the offsets given (the next
// offset to consume, per partition) and returns when the broker has answered
// or ctx is done. A nil error means every offset was acknowledged; any error
// means the outcome is failed or unknown for all of them.
//
// Close leaves the group and releases the client. It is called once, after
// the runner has made its final commit; it must not call the Sink
// synchronously in a way that waits for the runner.
type Source interface {
	Run(ctx context.Context, sink Sink) error
	Pause(tps []TP)
	Resume(tps []TP)
	Commit(ctx context.Context, offsets []Offset) error
	Close() error
}

// Offset is one partition's offset to commit: the next offset to consume.
type Offset struct {
	TP     TP
	Offset int64
}

// Assignment is one partition given to this member.
type Assignment struct {
	TP TP
	// Start is the first offset the source will deliver, or
	// watermark.Unknown when the source learns it only from the first fetch
	// (franz-go reports an assignment before fetching its committed
	// offsets).
	Start int64
	// Generation is the consumer group generation in which this member got
	// the partition, or -1 when the source does not know it (the zero
	// value, 0, is a real generation: sources set -1 explicitly). Within a
	// group, generations only grow and a partition is given to one member
	// per generation, so of two assignments of the same partition the one
	// with the higher generation is the newer; equal generations are the
	// same assignment (a member that rejoined and got the current
	// generation back, or a static member replaced without a rebalance).
	// An assign hook can use it to refuse a stale assignment that reaches
	// it late; generations restart when the group's metadata is deleted, so
	// such a rule needs a way to reset (docs/inbox.md: why pkg/inbox does
	// not use it yet).
	Generation int32
	// Member is the member id the group coordinator gave this member for
	// that generation, or "" when the source does not know it.
	Member string
}

// NoGeneration is Assignment.Generation when the source does not know the
// generation of the assignment.
const NoGeneration int32 = -1

// Batch is the records fetched for one partition, in offset order. Position,
// when not negative, is the source's next fetch offset after these records;
// it is beyond the last record's offset+1 when the client skipped control
// records or compacted offsets, and lets the committed offset reach the end
// of a transactional partition.
type Batch struct {
	TP       TP
	Records  []Record
	Position int64
	// HighWatermark is the partition's high watermark from the fetch, or -1;
	// the runner reports lag against it.
	HighWatermark int64
}

// Sink is how a Source reports to the runner. All methods are safe for
// concurrent use and block until the runner has acted. Once the runner is
// shutting down, Assigned and Fetched return ErrStopped at once (the source
// should then stop fetching and let its client's callbacks return), while
// Revoked and Lost are still acted on until the runner has stopped; after
// that every method returns ErrStopped at once.
type Sink interface {
	// Assigned sets up the partitions with fresh epochs before any of their
	// records are delivered. A partition the runner still holds from an
	// earlier assignment (no Revoked or Lost came between) is dropped as
	// lost first, and then, as for Lost, Assigned returns only once no
	// commit built before can still reach Source.Commit.
	Assigned(ctx context.Context, parts []Assignment) error
	// Revoked stops dispatch for tps, drains their in-flight handlers until
	// everything is done or the deadline passes (zero: the runner's drain
	// budget), commits the safe offsets synchronously through Source.Commit,
	// and ends their epochs. It returns after the final commit was answered,
	// with a *DrainError for handlers still running at the deadline and a
	// *FinalCommitError when that commit was not acknowledged.
	Revoked(ctx context.Context, tps []TP, deadline time.Time) error
	// Lost drops tps without committing anything for them and cancels their
	// in-flight handlers' contexts. It returns once no commit the runner
	// built before the loss can still reach Source.Commit.
	Lost(ctx context.Context, tps []TP) error
	// Fetched hands over records. It returns how many records the next poll
	// may take, in all, without pushing any unpaused partition past its high
	// water mark or its uncommitted window (at least 1). Called with no
	// batches it only returns that budget: sources call it so before their
	// first poll. The runner copies everything it keeps, the records' key,
	// value and header bytes included: the source may reuse or release the
	// batches' memory, and its client's buffers, once it returned.
	Fetched(ctx context.Context, batches []Batch) (budget int, err error)
}

// ErrStopped is returned by Sink methods once the runner is stopping, and by
// Run when called on a runner that already ran or that Shutdown or Close
// stopped before Run.
var ErrStopped = errors.New("runner: stopped")

// DeadLetterWriter writes a record that failed every attempt to a dead-letter
// topic and returns once the write is acknowledged. The franz adapter
// implements it; the runner uses the Source when it implements it, or the
// writer given with the DeadLetter policy.
type DeadLetterWriter interface {
	WriteDeadLetter(ctx context.Context, topic string, rec Record) error
}

// ErrFenced is returned, wrapped, by a handler that found its partition's
// lease taken by a newer owner (pkg/inbox does this). The record is neither
// completed nor retried: the attempt changed nothing, and the record belongs
// to the new owner, who will handle it. Its lane stays held: the later
// records of its key (KeyOrder) or partition (PartitionOrder) wait for the
// revoke or loss that follows, so none of them applies before it. It is
// counted in tidemark.records.fenced.
var ErrFenced = errors.New("runner: fenced by a newer owner")

// ErrOutcomeUnknown is returned, wrapped, by a handler that cannot tell
// whether its attempt took effect (pkg/inbox: a COMMIT whose answer was
// lost, and whose transaction it could not find committed or rolled back in
// time). The record is retried with backoff whatever the failure policy:
// it is never skipped or dead-lettered, since it may have been applied, and
// a later attempt learns which (the inbox finds its row). Attempts that
// fail this way count toward the policy's attempts like any other.
var ErrOutcomeUnknown = errors.New("runner: outcome of the attempt unknown")

// AssignHook runs once for each assignment report (Sink.Assigned), with
// all of its partitions, before any of their records run, on the source's
// goroutine (so a revoke or fetch waits for it). It can take leases on the
// partitions — all of them in one round trip — and return one Applied
// filter per assignment, in the order of as; a nil slice, or a nil entry,
// applies to nothing, and a slice of any other length is an error. An error
// is retried for the whole report with the runner's backoff until the hook
// succeeds, the runner stops, or ctx ends: records of partitions whose hook
// failed are never handled. ctx is the one the source passed to
// Sink.Assigned: the kafkago adapter's ends with the assignment's
// generation; franz-go's is Run's (franz-go cannot end the assignment while
// its callback runs). Because a hook can still be retrying after the
// assignment ended — and after the partitions went to another member — a
// hook that takes a lease can take it from the newer owner;
// Assignment.Generation lets it tell the two apart.
type AssignHook func(ctx context.Context, as []Assignment) ([]Applied, error)

// Applied reports whether the record at offset already had its effect
// applied (for example, it has an inbox row); the runner then completes it
// without calling the handler. It is called from worker goroutines and must
// be safe for concurrent use. A nil Applied applies to nothing.
type Applied func(offset int64) bool

// PerPartition adapts a hook written for one partition at a time to an
// AssignHook: it calls f for each assignment of a report, in order, and
// stops at the first error (the whole report is then retried). A hook that
// does I/O per partition costs a round trip each; write an AssignHook
// directly to batch them.
func PerPartition(f func(ctx context.Context, a Assignment) (Applied, error)) AssignHook {
	return func(ctx context.Context, as []Assignment) ([]Applied, error) {
		out := make([]Applied, len(as))
		for i, a := range as {
			applied, err := f(ctx, a)
			if err != nil {
				return nil, err
			}
			out[i] = applied
		}
		return out, nil
	}
}

// FetchLimiter is implemented by a Source whose client fetches records
// ahead of the runner and buffers them. New calls LimitFetch once, before
// Run, with the share of MaxBufferedBytes the source may use; an error
// makes New fail with a *ConfigError. A Source that holds no records of its
// own need not implement it.
type FetchLimiter interface {
	LimitFetch(FetchLimits) error
}

// FetchLimits bounds what a Source holds for records it fetched and has
// not yet handed to the runner.
type FetchLimits struct {
	// Bytes is the most the source may hold at once for fetched records:
	// its client's fetch buffers as they came from the broker, decompressed
	// and decoded, and the adapter's own copies of records it took from the
	// client and has not handed over. It is SourceShare of MaxBufferedBytes.
	// The runner's own limit assumes it: a hand-over brings at most Bytes
	// of key, value and header bytes.
	Bytes int64
	// PartitionBytes is the most one partition's records from one fetch
	// should bring: the gap between the byte water marks, the room a
	// partition has once it was resumed.
	PartitionBytes int64
	// MinRecordBytes and MaxCompression are the assumptions the bound
	// rests on (RecordShape): no record is smaller than MinRecordBytes
	// bytes uncompressed, framing included, and no batch is compressed more
	// than MaxCompression times. A source sizes its fetches from them.
	MinRecordBytes int
	MaxCompression float64
}

// Grouped is implemented by a Source that consumes as a member of a named
// group (a consumer group, or a share group). The runner reads Group once,
// in New, for its spans (messaging.consumer.group.name), its metrics and
// the dead-letter records' HeaderGroup; a source without a group (one
// assigned its partitions by hand) leaves them without one.
type Grouped interface {
	Group() string
}
