// Package rebalance tracks which partitions this consumer owns, under which
// assignment epoch, and what each may commit.
//
// Every assignment of a partition gets a new epoch from a local counter (never
// the Kafka generation id: a member can rejoin with the same generation and
// the same partitions) and a fresh [watermark.Tracker]. Work is tagged with
// the epoch it was dispatched under; a completion from an ended epoch is
// [OldAssignment], one for a partition no longer owned is [NotOwner], and
// neither moves a watermark (both are counted, see [Table.Stale]). A normal
// revoke yields the final safe offset to commit; a lost partition yields
// nothing, and [Table.Pending] only ever offers owned partitions for commit.
//
// Each partition keeps a [watermark.Sequencer] for its whole life in the
// table, so commit requests stay monotonic and late answers are handled
// across revokes. The package is pure, and a [Table] is not safe for
// concurrent use: the runner's poll goroutine owns it.
package rebalance
