package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Store is the inbox of one consumer group in one PostgreSQL database. It
// hands out the handler middleware (Handler), the runner's assign hook
// (AssignHook) and retention (Prune, RunRetention). A Store is safe for
// concurrent use; it starts no goroutine of its own and has nothing to
// close (the pool is the caller's).
//
// Each member of the group needs its own Store: the Store remembers the
// lease epochs its assign hook took, and its handlers are fenced by them.
type Store struct {
	pool  *pgxpool.Pool
	group string
	cfg   config
	log   *slog.Logger
	// holder names this Store in the retention lease: its Owner and a
	// random suffix, since replicas may share an Owner.
	holder string

	// schema holds the Store's schema-qualified names and statements once
	// known: at New with the Schema option, else found on first use (see
	// resolve) and kept, so that nothing a session does later — an effect
	// running SET search_path on a pooled connection — moves the inbox.
	schema atomic.Pointer[schema]
	tel    *telemetry
	stats  counters
	doubts doubts // records whose last COMMIT is in doubt

	// leases maps each partition this member was assigned to the lease
	// it took. Assignments are rare and handlers read it per record, so it
	// is copied on write and read without a lock.
	leaseMu sync.Mutex
	leases  atomic.Pointer[map[runner.TP]lease]

	owning owning // retakes of leases taken by late bumps (Owners)
}

// New returns the Store of group (the consumer group's name; the inbox rows
// and leases of different groups are independent) over pool. It validates
// its arguments and options and returns a *ConfigError for the first
// invalid one; it does not touch the database (Check and Migrate do).
func New(pool *pgxpool.Pool, group string, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, &ConfigError{Option: "pool", Reason: "nil pool"}
	}
	if group == "" {
		return nil, &ConfigError{Option: "group", Reason: "empty group"}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.owner == "" {
		cfg.owner = defaultOwner()
	}
	s := &Store{
		pool:  pool,
		group: group,
		cfg:   cfg,
		log:   cfg.logger.With("component", "tidemark.inbox", "group", group),
	}
	s.holder = cfg.owner + "/" + randomHex(4)
	if cfg.schema != "" {
		s.schema.Store(newSchema(cfg.schema))
	}
	tel, err := newTelemetry(cfg.meterProvider, group, cfg.batch > 1)
	if err != nil {
		return nil, fmt.Errorf("inbox: telemetry: %w", err)
	}
	s.tel = tel
	s.leases.Store(&map[runner.TP]lease{})
	if !s.replayProtected() {
		s.log.Warn("inbox: REPLAY PROTECTION OFF (UnsafeNoReplayProtection, a test hook of a tidemark_unsafe build): replayed records are applied again")
	}
	return s, nil
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + randomHex(3)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Group returns the consumer group the Store was made for.
func (s *Store) Group() string { return s.group }

// Owner returns the name this Store writes in the lease table.
func (s *Store) Owner() string { return s.cfg.owner }

// schema is the schema a Store works in: the names of its objects and the
// statements over them.
type schema struct {
	n   names
	sql statements
}

func newSchema(name string) *schema {
	n := newNames(name)
	return &schema{n: n, sql: newStatements(n)}
}

// resolve returns the Store's schema. Without the Schema option the first
// call finds the first existing schema of the search_path, as PostgreSQL
// would for an unqualified name, and every later call returns that one.
// New does not do it because New does no I/O; Check, Migrate, the assign
// hook and retention call it first, so it is found before any effect runs.
func (s *Store) resolve(ctx context.Context) (*schema, error) {
	if sc := s.schema.Load(); sc != nil {
		return sc, nil
	}
	var cur *string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
		return nil, connError("finding the inbox's schema", err)
	}
	if cur == nil {
		return nil, errNoSchema
	}
	// Two first calls at once both ask; they get the same answer, and the
	// first one stored wins.
	s.schema.CompareAndSwap(nil, newSchema(*cur))
	return s.schema.Load(), nil
}

var errNoSchema = errors.New("inbox: no schema of the search_path exists; create one or pass Schema")

// Migrate is the package's Migrate with the Store's Schema and Logger.
func (s *Store) Migrate(ctx context.Context) error {
	sc, err := s.resolve(ctx)
	if err != nil {
		return err
	}
	_, err = migrate(ctx, s.pool, sc.n, s.cfg)
	return err
}

// Check returns nil when the database answers and the inbox's schema is at
// SchemaVersion or newer; otherwise an error saying which: one that cannot
// reach the server names the connection problem, and a missing or old
// schema is ErrNotMigrated (wrapped) with the command that fixes it. Call
// it (or Migrate) before starting the runner, so a wrong DSN or a missing
// migration is an error at start rather than an assign hook retried
// forever.
func (s *Store) Check(ctx context.Context) error {
	sc, err := s.resolve(ctx)
	if err != nil {
		return err
	}
	v, err := version(ctx, s.pool, sc.n)
	if err != nil {
		return connError("check", err)
	}
	if v < SchemaVersion {
		return notMigrated(sc.n, v)
	}
	return nil
}

func notMigrated(n names, v int) error {
	where := "the search_path's schema"
	if n.schema != "" {
		where = "schema " + n.schema
	}
	return fmt.Errorf("%w: %s is at version %d, this build needs %d; run `tidemark inbox migrate --dsn …` or Store.Migrate",
		ErrNotMigrated, where, v, SchemaVersion)
}

// Epoch returns the lease epoch this Store took for tp at its last
// assignment, and whether it took one. It is the epoch the Store's handlers
// check at commit.
func (s *Store) Epoch(tp runner.TP) (int64, bool) {
	l, ok := s.lease(tp)
	return l.epoch, ok
}

func (s *Store) lease(tp runner.TP) (lease, bool) {
	l, ok := (*s.leases.Load())[tp]
	return l, ok
}

func (s *Store) setEpoch(tp runner.TP, epoch int64) {
	s.setLeases(map[runner.TP]lease{tp: {epoch: epoch}})
}

// setLeases records the leases an assignment took, in one copy of the map.
func (s *Store) setLeases(leases map[runner.TP]lease) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	old := *s.leases.Load()
	m := make(map[runner.TP]lease, len(old)+len(leases))
	for k, v := range old {
		m[k] = v
	}
	for k, v := range leases {
		m[k] = v
	}
	s.leases.Store(&m)
}

// setLeaseIfNewer records a lease taken back (see retake), unless an
// assignment took a newer one meanwhile.
func (s *Store) setLeaseIfNewer(tp runner.TP, l lease) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	old := *s.leases.Load()
	if cur, ok := old[tp]; ok && cur.epoch >= l.epoch {
		return
	}
	m := make(map[runner.TP]lease, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[tp] = l
	s.leases.Store(&m)
}

// Stats are a Store's counters since New, the same numbers its
// OpenTelemetry counters report.
type Stats struct {
	// Applied is the records whose effect and inbox row committed.
	Applied int64
	// Replays is the records whose inbox insert found the row already
	// there (an idempotency conflict): their effect was not run again.
	// Records the assign hook's filter skipped are counted by the runner
	// (tidemark.records.replay_skipped), not here.
	Replays int64
	// Fenced is the transactions refused because the partition's lease had
	// moved to a newer epoch.
	Fenced int64
	// Retries is the transactions run again after a serialization failure
	// or a deadlock.
	Retries int64
	// Leases is the lease epochs taken by the assign hook.
	Leases int64
	// Loaded is the applied offsets the assign hook loaded for replay skip.
	Loaded int64
	// Pruned is the inbox rows deleted by retention.
	Pruned int64
	// Batches is the transactions that applied records with Batch > 1.
	Batches int64
	// Retaken is the leases taken back (Owners) after a late bump from an
	// ended assignment had taken them from this member, which the group
	// coordinator said owns the partition.
	Retaken int64
}

type counters struct {
	applied, replays, fenced, retries atomic.Int64
	leases, loaded, pruned, batches   atomic.Int64
	retaken                           atomic.Int64
}

// Stats returns the Store's counters. It is safe to call at any time.
func (s *Store) Stats() Stats {
	return Stats{
		Applied: s.stats.applied.Load(),
		Replays: s.stats.replays.Load(),
		Fenced:  s.stats.fenced.Load(),
		Retries: s.stats.retries.Load(),
		Leases:  s.stats.leases.Load(),
		Loaded:  s.stats.loaded.Load(),
		Pruned:  s.stats.pruned.Load(),
		Batches: s.stats.batches.Load(),
		Retaken: s.stats.retaken.Load(),
	}
}
