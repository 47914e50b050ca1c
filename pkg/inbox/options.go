package inbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Option configures a Store (and Migrate).
type Option func(*config)

type config struct {
	schema         string
	owner          string
	dedup          func(rec *runner.Record) (string, bool)
	owners         Coordinator
	share          bool
	replayLimit    int
	batch          int
	batchWait      time.Duration
	retries        int
	txOptions      pgx.TxOptions
	retainRecords  int64
	retainFor      time.Duration
	dedupWindow    time.Duration
	pruneBatch     int
	inDoubtTimeout time.Duration
	migrateTo      int
	logger         *slog.Logger
	meterProvider  metric.MeterProvider
	// noReplayProtection is set only by UnsafeNoReplayProtection, which
	// exists only in a tidemark_unsafe build; read it through
	// Store.replayProtected.
	noReplayProtection bool
	errs               []*ConfigError // from the options themselves; the first is reported
}

// Defaults the options document.
const (
	defaultReplayLimit   = 100_000
	defaultRetries       = 5
	defaultRetainRecords = 1_000
	defaultDedupWindow   = 7 * 24 * time.Hour
	defaultPruneBatch    = 1_000
	defaultInDoubt       = 5 * time.Second

	// maxBatch is PostgreSQL's PGPROC_MAX_CACHED_SUBXIDS: a transaction with
	// more subtransactions that wrote (one savepoint per record) overflows
	// its cache, and from then on every snapshot taken in the database while
	// it runs has to consult pg_subtrans, which slows the whole server.
	maxBatch = 64
)

func defaults() config {
	return config{
		replayLimit:    defaultReplayLimit,
		batch:          1,
		retries:        defaultRetries,
		retainRecords:  defaultRetainRecords,
		dedupWindow:    defaultDedupWindow,
		pruneBatch:     defaultPruneBatch,
		inDoubtTimeout: defaultInDoubt,
		logger:         slog.Default(),
	}
}

// Schema puts the inbox's tables in the named PostgreSQL schema, which must
// exist. Default "": the first schema of the connection's search_path, as
// for any unqualified name.
func Schema(name string) Option {
	return func(c *config) {
		if name == "" {
			c.errs = append(c.errs, &ConfigError{Option: "Schema", Reason: "empty name"})
		}
		c.schema = name
	}
}

// Owner names this member in the lease table's owner column, for people
// reading it; fencing relies on the epoch, not on the name. Default
// hostname-pid-random.
func Owner(id string) Option {
	return func(c *config) {
		if id == "" {
			c.errs = append(c.errs, &ConfigError{Option: "Owner", Reason: "empty id"})
		}
		c.owner = id
	}
}

// DedupKey gives records a business key (an order id, a message id) in
// addition to their offset: a second record of the same topic with the
// same key, at any offset of any of its partitions, is treated as a replay
// — its effect is not run and it counts as a replay. Keys are scoped to
// their topic: the same key on two topics the Store handles (an order and
// its refund) is two events, and both are applied. A key is any bytes of
// any length (the inbox keeps its SHA-256). f returns the key and whether
// the record has one; records without a key are deduplicated by offset
// only. Keys are kept for DedupWindow. f is called from worker goroutines
// and must be safe for concurrent use. Default none.
func DedupKey(f func(rec *runner.Record) (key string, ok bool)) Option {
	return func(c *config) {
		if f == nil {
			c.errs = append(c.errs, &ConfigError{Option: "DedupKey", Reason: "nil func"})
		}
		c.dedup = f
	}
}

// DedupHeader is DedupKey with the value of the record's last header named
// name (for example "message-id"), whatever its bytes; a record without
// it, or with an empty value, has no key. Keys are per topic (see
// DedupKey).
func DedupHeader(name string) Option {
	if name == "" {
		return func(c *config) {
			c.errs = append(c.errs, &ConfigError{Option: "DedupHeader", Reason: "empty header name"})
		}
	}
	return DedupKey(func(rec *runner.Record) (string, bool) {
		v, ok := rec.Header(name)
		if !ok || len(v) == 0 {
			return "", false
		}
		return string(v), true
	})
}

// ReplayLimit bounds how many inbox offsets the assign hook loads per
// partition to skip already-applied records without a transaction each:
// those at or above the assignment's start offset, or the newest ones when
// the source does not know the start offset yet (franz-go). Records beyond
// the loaded ones are still applied at most once — their inbox insert finds
// the row — but each costs a transaction. The offsets are kept as ranges,
// so memory is small unless the applied offsets are very sparse. 0 loads
// nothing. Default 100,000.
func ReplayLimit(n int) Option { return func(c *config) { c.replayLimit = n } }

// Batch applies up to n records of the same partition in one transaction,
// each in its own savepoint with its own inbox row, so a record whose effect
// fails is rolled back alone and the others commit. It is group commit: the
// first record that finds its partition idle starts a transaction with the
// records of that partition waiting by then (see BatchWait), and the ones
// that arrive meanwhile form the next batch. Records of one key are never
// in flight together (the runner's KeyOrder), so a batch gathers different
// keys of a partition: it helps with KeyOrder or Unordered and many records
// in flight per partition (runner.Concurrency well above the partitions
// owned), not with PartitionOrder, which has one record of a partition in
// flight at a time. n is at most 64 (PostgreSQL's per-transaction
// subtransaction cache). Default 1: one record per transaction.
func Batch(n int) Option { return func(c *config) { c.batch = n } }

// BatchWait is how long a batch's first record waits for others to join
// before its transaction starts, unless the batch is full sooner. Records
// come back to the handler a moment after the previous batch released them,
// so a short wait (a few hundred microseconds) makes batches much larger
// under load, at the price of that latency when the partition is idle.
// Default 0: a batch starts with whatever is waiting.
func BatchWait(d time.Duration) Option { return func(c *config) { c.batchWait = d } }

// Retries sets how many times a transaction that failed with a
// serialization failure (SQLSTATE 40001) or a deadlock (40P01) is run,
// with a short jittered backoff, before the error goes back to the runner's
// failure policy. Default 5.
func Retries(n int) Option { return func(c *config) { c.retries = n } }

// TxOptions sets the transaction mode of the inbox's transactions
// (isolation level, for example pgx.RepeatableRead). Fencing and replay
// detection hold at every isolation level. Default: the server's
// default, normally READ COMMITTED.
func TxOptions(o pgx.TxOptions) Option { return func(c *config) { c.txOptions = o } }

// RetainRecords is the margin, in offsets, that Prune and RunRetention keep
// below a partition's committed offset: rows at offsets at or above
// committed-n stay. A margin covers a group whose offsets an operator
// resets a little backward. Default 1,000.
func RetainRecords(n int64) Option { return func(c *config) { c.retainRecords = n } }

// RetainFor keeps rows younger than d even below the offset bound, for a
// margin in time rather than in records, and keeps the applied mark below
// every offset the group consumed less than d ago: retention raises it
// only to a committed offset it saw at least d ago (see Prune). So a dead
// letter stays redrivable for d. Default 0: the offset bound alone.
func RetainFor(d time.Duration) Option { return func(c *config) { c.retainFor = d } }

// DedupWindow is how long rows with a DedupKey are kept, whatever their
// offset: a duplicate arriving later than that is applied again. Rows are
// never pruned above the offset bound, whatever their age. Default 7 days.
func DedupWindow(d time.Duration) Option { return func(c *config) { c.dedupWindow = d } }

// PruneBatch is how many rows one DELETE of Prune removes; each is its own
// short transaction, so retention never holds locks for long. Default 1,000.
func PruneBatch(n int) Option { return func(c *config) { c.pruneBatch = n } }

// InDoubtTimeout bounds how long a handler whose COMMIT's answer was lost
// (the connection broke, or its ctx ended, while PostgreSQL committed)
// keeps asking PostgreSQL, on another connection, whether the transaction
// committed, as long as the handler's ctx lasts. Committed, the record is
// applied and the handler returns nil; rolled back, it returns an ordinary
// error for the runner's policy; still unknown at the bound (a COMMIT
// waiting for a synchronous standby that does not answer, or a server that
// cannot be reached), an *InDoubtError, which the runner retries whatever
// its policy — never dead-lettered or skipped. Default 5s.
func InDoubtTimeout(d time.Duration) Option { return func(c *config) { c.inDoubtTimeout = d } }

// MigrateTo makes Migrate stop at schema version v instead of
// SchemaVersion: to stage an upgrade (migrate, run the older build, then
// migrate the rest), and to test the upgrade path. Migrations are never
// undone: a schema already past v is left as it is. A Store needs
// SchemaVersion (Check). Only Migrate reads it. Default SchemaVersion.
func MigrateTo(v int) Option {
	return func(c *config) {
		if v < 1 || v > SchemaVersion {
			c.errs = append(c.errs, &ConfigError{Option: "MigrateTo", Reason: fmt.Sprintf("version %d is not within 1..%d", v, SchemaVersion)})
		}
		c.migrateTo = v
	}
}

// Logger sets the structured logger. Default slog.Default().
func Logger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.errs = append(c.errs, &ConfigError{Option: "Logger", Reason: "nil logger"})
		}
		c.logger = l
	}
}

// MeterProvider sets the OpenTelemetry meter provider. Default the global
// one.
func MeterProvider(p metric.MeterProvider) Option { return func(c *config) { c.meterProvider = p } }

// ConfigError is returned by New for an invalid argument or option; Option
// names it.
type ConfigError struct {
	Option string
	Reason string
}

func (e *ConfigError) Error() string { return "inbox: option " + e.Option + ": " + e.Reason }

func (c *config) validate() error {
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: opt, Reason: fmt.Sprintf(format, a...)}
	}
	if len(c.errs) > 0 {
		return c.errs[0]
	}
	switch {
	case c.share && c.owners != nil:
		return bad("Owners", "a ShareGroup Store has no lease to take back: a share group has no partition owner")
	case c.replayLimit < 0:
		return bad("ReplayLimit", "%d is negative", c.replayLimit)
	case c.batch < 1 || c.batch > maxBatch:
		return bad("Batch", "%d is not within 1..%d (PostgreSQL caches %d subtransactions per transaction)", c.batch, maxBatch, maxBatch)
	case c.batchWait < 0:
		return bad("BatchWait", "%v is negative", c.batchWait)
	case c.retries < 1:
		return bad("Retries", "%d is not positive", c.retries)
	case c.retainRecords < 0:
		return bad("RetainRecords", "%d is negative", c.retainRecords)
	case c.retainFor < 0:
		return bad("RetainFor", "%v is negative", c.retainFor)
	case c.dedupWindow <= 0:
		return bad("DedupWindow", "%v is not positive", c.dedupWindow)
	case c.pruneBatch < 1:
		return bad("PruneBatch", "%d is not positive", c.pruneBatch)
	case c.inDoubtTimeout <= 0:
		return bad("InDoubtTimeout", "%v is not positive", c.inDoubtTimeout)
	}
	return nil
}
