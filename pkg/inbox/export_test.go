package inbox

import "github.com/tidemark/tidemark/pkg/runner"

// Exports for the external tests of this package.

var (
	NewOffsetSet   = func(offs []int64) func(int64) bool { return newOffsetSet(offs).contains }
	OffsetSetRuns  = func(offs []int64) int { return newOffsetSet(offs).runs() }
	Retryable      = retryable
	RetryBackoff   = retryBackoff
	Pipelined      = pipelined
	SavepointNames = savepointNames[:]
	LastMigration  = func() int { return migrations[len(migrations)-1].version }
	LockKey        = lockKey
	DollarQuote    = dollarQuote
	InDoubt        = inDoubt
	ConnError      = connError
)

// OriginOf returns the origin rec's headers name ("" for none), or the
// error the handlers return for them.
func OriginOf(rec *runner.Record) (string, error) {
	o, err := originOf(rec)
	if o == nil {
		return "", err
	}
	return o.String(), err
}

// DedupKeyOf returns the dedup key s gives rec.
var DedupKeyOf = (*Store).dedupKey

// SetEpoch gives s a lease epoch for tp as its assign hook would, without a
// database.
func SetEpoch(s *Store, tp runner.TP, epoch int64) { s.setEpoch(tp, epoch) }

// BatchHandler returns s's Batch handler (s needs Batch > 1) with its
// batches run by apply instead of PostgreSQL: apply gets the batch's
// records, leader first, and returns each one's result. parts reports how
// many partitions the batcher holds an entry for.
func BatchHandler(s *Store, apply func(recs []runner.Record) []error) (h runner.Handler, parts func() int) {
	b := newBatcher(s, nil)
	b.apply = func(batch []*item) {
		recs := make([]runner.Record, len(batch))
		for i, it := range batch {
			recs[i] = it.rec
		}
		for i, err := range apply(recs) {
			batch[i].err = err
		}
	}
	return b.handle, func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.parts)
	}
}

// ReplayProtected reports whether s skips replays (false only with
// UnsafeNoReplayProtection in a tidemark_unsafe build).
var ReplayProtected = (*Store).replayProtected

// AppliedFilter returns the Applied filter s's assign hook returns for a
// partition with the applied offsets offs and the applied mark below.
func AppliedFilter(s *Store, tp runner.TP, offs []int64, below int64) runner.Applied {
	return s.filter(tp, newOffsetSet(offs), len(offs), below)
}
