package inbox

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
)

// DedupKeyOf returns the dedup key s gives rec.
var DedupKeyOf = (*Store).dedupKey
