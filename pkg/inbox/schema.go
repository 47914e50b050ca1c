package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/runner"
)

// The inbox's tables and objects, unqualified.
const (
	inboxTable      = "tidemark_inbox"
	leaseTable      = "tidemark_lease"
	migrationsTable = "tidemark_inbox_migrations"
	retentionTable  = "tidemark_inbox_retention"
	boundsTable     = "tidemark_inbox_bounds"
	fenceFunc       = "tidemark_inbox_fence"
	leaseLockFunc   = "tidemark_lease_lock"
	dedupCompatFunc = "tidemark_inbox_dedup_compat"
)

// fencedCode is the SQLSTATE the fence trigger raises when an inbox row is
// committed under a lease epoch that is no longer the partition's.
const fencedCode = "TM001"

// belowMarkCode is the SQLSTATE the fence trigger raises when an inbox row
// is committed below its partition's applied low-water mark: retention
// deleted the offset's row after the claim looked, so the record is a
// replay.
const belowMarkCode = "TM002"

// names are the SQL names of the inbox's objects, schema-qualified when a
// Schema was given.
type names struct {
	schema     string // "" means the search_path
	inbox      string
	lease      string
	migrations string
	retention  string
	bounds     string
	fence      string
}

// dollarQuote quotes body as a PostgreSQL dollar-quoted string with a tag
// body does not contain, so that no name in body — a schema may be called
// anything, "$fence$" included — can end the string early.
func dollarQuote(body string) string {
	tag := "$fence$"
	for i := 1; strings.Contains(body, tag); i++ {
		tag = "$fence" + strconv.Itoa(i) + "$"
	}
	return tag + body + tag
}

func newNames(schema string) names {
	q := func(name string) string { return qualify(schema, name) }
	return names{schema: schema, inbox: q(inboxTable), lease: q(leaseTable), migrations: q(migrationsTable),
		retention: q(retentionTable), bounds: q(boundsTable), fence: q(fenceFunc)}
}

// q qualifies the name of an object of the inbox with the names' schema.
func (n names) q(name string) string { return qualify(n.schema, name) }

func qualify(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// migration is one version of the schema. Migrations are only ever added,
// and each must leave the previous version's statements working, so an
// older build keeps running against a newer schema during a rolling
// deploy.
type migration struct {
	version     int
	description string
	sql         func(n names) string
}

var migrations = []migration{{
	version:     1,
	description: "inbox rows, partition leases, the commit-time fence",
	sql: func(n names) string {
		return `
CREATE TABLE ` + n.lease + ` (
	group_id    text        NOT NULL,
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	epoch       bigint      NOT NULL,
	owner       text        NOT NULL,
	acquired_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (group_id, topic, partition)
);
COMMENT ON TABLE ` + n.lease + ` IS 'tidemark: the owner of each partition for the inbox; every assignment bumps epoch';

CREATE TABLE ` + n.inbox + ` (
	group_id   text        NOT NULL,
	topic      text        NOT NULL,
	partition  integer     NOT NULL,
	"offset"   bigint      NOT NULL,
	epoch      bigint      NOT NULL,
	dedup_key  text,
	applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (group_id, topic, partition, "offset")
);
COMMENT ON TABLE ` + n.inbox + ` IS 'tidemark: one row per record whose effect committed, written in the effect''s transaction';
CREATE UNIQUE INDEX ` + pgx.Identifier{inboxTable + "_dedup"}.Sanitize() + ` ON ` + n.inbox + ` (group_id, dedup_key) WHERE dedup_key IS NOT NULL;

-- The fence: at COMMIT, every inbox row the transaction wrote checks that
-- its partition's lease is still at the epoch the row was written under,
-- and holds the lease row FOR SHARE until the commit is done. A lease bump
-- (an UPDATE of the row) therefore waits for a committing old owner, and
-- an old owner that commits after a bump fails here and rolls back.
CREATE FUNCTION ` + n.fence + `() RETURNS trigger LANGUAGE plpgsql AS ` + dollarQuote(`
DECLARE
	current bigint;
BEGIN
	SELECT l.epoch INTO current FROM `+n.lease+` l
	 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition
	   FOR SHARE;
	IF current IS DISTINCT FROM NEW.epoch THEN
		RAISE EXCEPTION USING ERRCODE = '`+fencedCode+`',
			MESSAGE = format('tidemark inbox: fenced: %s/%s@%s was applied under lease epoch %s, the partition''s lease is at epoch %s',
				NEW.topic, NEW.partition, NEW."offset", NEW.epoch, coalesce(current::text, 'none'));
	END IF;
	RETURN NULL;
END
`) + `;
CREATE CONSTRAINT TRIGGER ` + pgx.Identifier{inboxTable + "_fence"}.Sanitize() + `
	AFTER INSERT ON ` + n.inbox + `
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION ` + n.fence + `();
`
	},
},

	{
		version:     2,
		description: "a fence no session setting switches off, with no row lock under read committed; dedup keys of any bytes, per topic; the applied low-water mark; a retention lease; the member id of each lease",
		sql: func(n names) string {
			return `
-- The applied low-water mark: every offset of the partition below it was
-- consumed by the group (its effect applied, or the record dead-lettered
-- or skipped), whether or not its inbox row is still there. Retention
-- raises it in the transaction that deletes the rows below it, so a
-- record below it is a replay even after its row is gone and the group's
-- committed offsets with it.
ALTER TABLE ` + n.lease + ` ADD COLUMN applied_below bigint NOT NULL DEFAULT 0;
-- The Kafka member id of the assignment the lease was taken for, for
-- people comparing it with the group's description.
ALTER TABLE ` + n.lease + ` ADD COLUMN member text;
COMMENT ON COLUMN ` + n.lease + `.member IS 'tidemark: the Kafka member id of the assignment the lease was taken for, NULL when the source did not know it';
COMMENT ON COLUMN ` + n.lease + `.applied_below IS 'tidemark: every offset below it was consumed by the group; raised by retention with the rows it deletes';
-- Which Store runs the group's retention round, until when. A row rather
-- than a session advisory lock: it works through a pooler in transaction
-- mode (PgBouncer), where consecutive statements of one client run in
-- different sessions.
CREATE TABLE ` + n.retention + ` (
	group_id text        PRIMARY KEY,
	holder   text        NOT NULL,
	until    timestamptz NOT NULL
);
COMMENT ON TABLE ` + n.retention + ` IS 'tidemark: the Store running each group''s retention round, and until when';

-- Dedup keys are any bytes: the table keeps their SHA-256 (dedup_hash),
-- unique per topic, instead of the key as text (which refused keys that
-- are not UTF-8 or hold a NUL, and long ones: a btree row holds at most
-- about 2.7 kB). dedup_key keeps the digest in hex, so that a build of
-- version 1 running retention during a rolling upgrade still sees the row
-- as keyed. Rows of version 1 get the digest of their key; a build of
-- version 1 inserting a key gets it from the trigger below, so both builds
-- find each other's keys.
ALTER TABLE ` + n.inbox + ` ADD COLUMN dedup_hash bytea;
COMMENT ON COLUMN ` + n.inbox + `.dedup_hash IS 'tidemark: SHA-256 of the record''s dedup key (DedupKey), unique per group and topic';
COMMENT ON COLUMN ` + n.inbox + `.dedup_key IS 'tidemark: the dedup key''s SHA-256 in hex (version 1: the key itself)';
UPDATE ` + n.inbox + ` SET dedup_hash = sha256(convert_to(dedup_key, 'UTF8')) WHERE dedup_key IS NOT NULL;
DROP INDEX ` + n.q(inboxTable+"_dedup") + `;
CREATE UNIQUE INDEX ` + pgx.Identifier{inboxTable + "_dedup_hash"}.Sanitize() + ` ON ` + n.inbox + ` (group_id, topic, dedup_hash)
	WHERE dedup_hash IS NOT NULL;
CREATE FUNCTION ` + n.q(dedupCompatFunc) + `() RETURNS trigger LANGUAGE plpgsql AS ` + dollarQuote(`
BEGIN
	NEW.dedup_hash := sha256(convert_to(NEW.dedup_key, 'UTF8'));
	RETURN NEW;
END
`) + `;
CREATE TRIGGER ` + pgx.Identifier{dedupCompatFunc}.Sanitize() + ` BEFORE INSERT ON ` + n.inbox + `
	FOR EACH ROW WHEN (NEW.dedup_hash IS NULL AND NEW.dedup_key IS NOT NULL)
	EXECUTE FUNCTION ` + n.q(dedupCompatFunc) + `();
ALTER TABLE ` + n.inbox + ` ENABLE ALWAYS TRIGGER ` + pgx.Identifier{dedupCompatFunc}.Sanitize() + `;
-- Retention expires dedup keys by age, without reading the unexpired ones.
CREATE INDEX ` + pgx.Identifier{inboxTable + "_dedup_expiry"}.Sanitize() + ` ON ` + n.inbox + ` (group_id, topic, partition, applied_at)
	WHERE dedup_hash IS NOT NULL;

-- The lease lock: every change of a lease's epoch — a bump by any build,
-- or a reset — takes the partition's advisory lock for the rest of its
-- transaction, whoever sends it.
CREATE FUNCTION ` + n.q(leaseLockFunc) + `() RETURNS trigger LANGUAGE plpgsql AS ` + dollarQuote(`
BEGIN
	PERFORM pg_advisory_xact_lock(`+leaseKeySQL+`);
	RETURN NEW;
END
`) + `;
CREATE TRIGGER ` + pgx.Identifier{leaseLockFunc}.Sanitize() + ` BEFORE INSERT OR UPDATE OF epoch ON ` + n.lease + `
	FOR EACH ROW EXECUTE FUNCTION ` + n.q(leaseLockFunc) + `();
ALTER TABLE ` + n.lease + ` ENABLE ALWAYS TRIGGER ` + pgx.Identifier{leaseLockFunc}.Sanitize() + `;

-- The fence. Under READ COMMITTED it holds the partition's advisory lock
-- shared, rather than the lease row FOR SHARE: the two exclude a bump the
-- same way, but every share lock two transactions hold on one row at once
-- costs a multixact id, which sends the table into anti-wraparound vacuums
-- under load, and an advisory lock costs none. The SELECT after the lock
-- takes a new snapshot (READ COMMITTED), so it sees a bump that committed
-- while the fence waited for it. REPEATABLE READ and SERIALIZABLE read the
-- transaction's snapshot, which may be older than a committed bump; the
-- row lock makes such a read fail with a serialization error instead.
CREATE OR REPLACE FUNCTION ` + n.fence + `() RETURNS trigger LANGUAGE plpgsql AS ` + dollarQuote(`
DECLARE
	current bigint;
	below   bigint;
BEGIN
	IF current_setting('transaction_isolation') = 'read committed' THEN
		PERFORM pg_advisory_xact_lock_shared(`+leaseKeySQL+`);
		SELECT l.epoch, l.applied_below INTO current, below FROM `+n.lease+` l
		 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition;
	ELSE
		SELECT l.epoch, l.applied_below INTO current, below FROM `+n.lease+` l
		 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition
		   FOR SHARE;
	END IF;
	IF current IS DISTINCT FROM NEW.epoch THEN
		RAISE EXCEPTION USING ERRCODE = '`+fencedCode+`',
			MESSAGE = format('tidemark inbox: fenced: %s/%s@%s was applied under lease epoch %s, the partition''s lease is at epoch %s',
				NEW.topic, NEW.partition, NEW."offset", NEW.epoch, coalesce(current::text, 'none'));
	END IF;
	-- Retention deleted this offset's row and raised the mark after the
	-- claim looked (the claim waited for the delete, then found no row):
	-- the record is a replay.
	IF NEW."offset" < below THEN
		RAISE EXCEPTION USING ERRCODE = '`+belowMarkCode+`',
			MESSAGE = format('tidemark inbox: replay: %s/%s@%s is below the partition''s applied mark %s',
				NEW.topic, NEW.partition, NEW."offset", below);
	END IF;
	RETURN NULL;
END
`) + `;

-- The fence fires whatever the session's session_replication_role: under
-- "replica" (set by a session, or by an effect with SET LOCAL) an ordinary
-- trigger does not, and an old owner would commit after the lease moved.
ALTER TABLE ` + n.inbox + ` ENABLE ALWAYS TRIGGER ` + pgx.Identifier{inboxTable + "_fence"}.Sanitize() + `;
`
		},
	},

	{
		version:     3,
		description: "origin rows: a redriven dead letter recorded under the coordinates of the record first consumed",
		sql: func(n names) string {
			return `
-- An origin row is an inbox row at the coordinates of a dead letter's
-- origin record (its tidemark-origin-* headers), written in the
-- transaction of the redriven record that applied it, beside that
-- record's own row. Being an inbox row of the origin partition, it makes
-- a second redrive, and the origin record itself consumed again, a
-- replay; and the origin partition's retention prunes it like any row.
-- via_* name the redriven record; NULL on every other row.
ALTER TABLE ` + n.inbox + ` ADD COLUMN via_topic text;
ALTER TABLE ` + n.inbox + ` ADD COLUMN via_partition integer;
ALTER TABLE ` + n.inbox + ` ADD COLUMN via_offset bigint;
COMMENT ON COLUMN ` + n.inbox + `.via_topic IS 'tidemark: on an origin row, the topic of the redriven record that applied it (with via_partition, via_offset); NULL otherwise';

-- The fence, as in version 2, except for origin rows: an origin row is
-- written under the lease of the partition the redriven record came from,
-- not of the origin's partition (another member may own that one), and it
-- commits only with that record's own row, which the fence checks. So an
-- origin row is not checked against the origin partition's lease, nor its
-- applied mark (the claim looked at the mark; a prune that raised it
-- meanwhile has no row of it to delete).
CREATE OR REPLACE FUNCTION ` + n.fence + `() RETURNS trigger LANGUAGE plpgsql AS ` + dollarQuote(`
DECLARE
	current bigint;
	below   bigint;
BEGIN
	IF NEW.via_topic IS NOT NULL THEN
		RETURN NULL;
	END IF;
	IF current_setting('transaction_isolation') = 'read committed' THEN
		PERFORM pg_advisory_xact_lock_shared(`+leaseKeySQL+`);
		SELECT l.epoch, l.applied_below INTO current, below FROM `+n.lease+` l
		 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition;
	ELSE
		SELECT l.epoch, l.applied_below INTO current, below FROM `+n.lease+` l
		 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition
		   FOR SHARE;
	END IF;
	IF current IS DISTINCT FROM NEW.epoch THEN
		RAISE EXCEPTION USING ERRCODE = '`+fencedCode+`',
			MESSAGE = format('tidemark inbox: fenced: %s/%s@%s was applied under lease epoch %s, the partition''s lease is at epoch %s',
				NEW.topic, NEW.partition, NEW."offset", NEW.epoch, coalesce(current::text, 'none'));
	END IF;
	IF NEW."offset" < below THEN
		RAISE EXCEPTION USING ERRCODE = '`+belowMarkCode+`',
			MESSAGE = format('tidemark inbox: replay: %s/%s@%s is below the partition''s applied mark %s',
				NEW.topic, NEW.partition, NEW."offset", below);
	END IF;
	RETURN NULL;
END
`) + `;
`
		},
	},

	{
		version:     4,
		description: "the bounds retention saw, with when: with RetainFor the applied mark rises only to a bound that old",
		sql: func(n names) string {
			return `
-- The bounds retention was given for a partition (the group's committed
-- offset), each with the time it was first seen. With RetainFor(d) a round
-- raises the partition's applied mark only up to a bound seen at least d
-- ago: every offset below such a bound was consumed — applied, or
-- dead-lettered — at least d ago, so a dead letter stays above the mark,
-- and redrivable, for d. The rows of a version 3 build kept their offsets
-- with no row for a dead letter, which the mark passed at once.
CREATE TABLE ` + n.bounds + ` (
	group_id  text        NOT NULL,
	topic     text        NOT NULL,
	partition integer     NOT NULL,
	seen_at   timestamptz NOT NULL DEFAULT now(),
	bound     bigint      NOT NULL,
	PRIMARY KEY (group_id, topic, partition, seen_at)
);
COMMENT ON TABLE ` + n.bounds + ` IS 'tidemark: the committed offsets retention saw per partition, and when; with RetainFor the applied mark rises only to one that old';
`
		},
	},
}

// leaseKeySQL is the advisory lock key of NEW's partition, in the fence and
// the lease lock alike. Two partitions whose keys collide share a lock:
// their bumps and commits wait for each other, which costs time, never
// correctness.
const leaseKeySQL = `hashtextextended(NEW.group_id || '/' || NEW.topic || '/' || NEW.partition::text, 7468)`

// SchemaVersion is the schema version this build writes and needs: the
// version of its last migration.
const SchemaVersion = 4

// ErrNotMigrated is returned, wrapped, by Check and by the assign hook when
// the inbox's tables are missing or older than this build needs.
var ErrNotMigrated = errors.New("inbox: schema not migrated")

// Migrate creates or upgrades the inbox's tables to SchemaVersion (or
// MigrateTo's version). Only the Schema, Logger and MigrateTo options
// matter here. It is idempotent and safe to
// run from many replicas at once: the migrations run in one transaction
// under a transaction-scoped advisory lock, so one replica applies them and
// the others then find them applied. It returns nil when nothing was left
// to do. ctx bounds the whole migration, including the wait for the lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return &ConfigError{Option: "pool", Reason: "nil pool"}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	_, err := migrate(ctx, pool, newNames(cfg.schema), cfg)
	return err
}

// Version returns the inbox schema version of the database pool reaches (in
// the Schema option's schema, else the search_path's): 0 when it was never
// migrated. Only the Schema option matters here.
func Version(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (int, error) {
	if pool == nil {
		return 0, &ConfigError{Option: "pool", Reason: "nil pool"}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return 0, err
	}
	v, err := version(ctx, pool, newNames(cfg.schema))
	if err != nil {
		return 0, connError("version", err)
	}
	return v, nil
}

// migrate applies the missing migrations and returns the versions it
// applied.
func migrate(ctx context.Context, pool *pgxpool.Pool, n names, cfg config) ([]int, error) {
	// READ COMMITTED whatever the role's default_transaction_isolation:
	// under REPEATABLE READ the snapshot would be taken before the lock is
	// granted, and a replica that waited for another's migration would
	// not see it, run it again and fail ("relation already exists").
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, connError("migrate", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op

	schema := n.schema
	if schema == "" {
		var cur *string
		if err := tx.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
			return nil, fmt.Errorf("inbox: migrate: %w", err)
		}
		if cur == nil {
			return nil, errors.New("inbox: migrate: no schema of the search_path exists; create one or pass Schema")
		}
		schema = *cur
	}
	// The lock is per schema: replicas of one service serialize, services
	// in other schemas of the same database do not wait for each other.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey("tidemark.inbox.migrate", schema)); err != nil {
		return nil, fmt.Errorf("inbox: migrate: taking the migration lock: %w", err)
	}
	// Qualify every name from here on, so the fence function refers to the
	// lease table of this schema whatever the search_path of the sessions
	// that later fire it.
	n = newNames(schema)
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.migrations+` (
	version     integer     PRIMARY KEY,
	description text        NOT NULL,
	applied_at  timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return nil, fmt.Errorf("inbox: migrate: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+n.migrations).Scan(&current); err != nil {
		return nil, fmt.Errorf("inbox: migrate: %w", err)
	}
	var applied []int
	for _, m := range migrations {
		if m.version <= current || (cfg.migrateTo > 0 && m.version > cfg.migrateTo) {
			continue
		}
		if _, err := tx.Exec(ctx, m.sql(n)); err != nil {
			return nil, fmt.Errorf("inbox: migrate to version %d (%s) in schema %s: %w", m.version, m.description, schema, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+n.migrations+" (version, description) VALUES ($1, $2)", m.version, m.description); err != nil {
			return nil, fmt.Errorf("inbox: migrate: %w", err)
		}
		applied = append(applied, m.version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("inbox: migrate: commit: %w", err)
	}
	if len(applied) > 0 {
		cfg.logger.Info("inbox schema migrated", "component", "tidemark.inbox", "schema", schema, "from", current, "to", applied[len(applied)-1])
	}
	return applied, nil
}

// version returns the schema version recorded in the migrations table, 0
// when the table does not exist.
func version(ctx context.Context, q querier, n names) (int, error) {
	var v int
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+n.migrations).Scan(&v)
	if isCode(err, "42P01") { // undefined_table
		return 0, nil
	}
	return v, err
}

// querier is what pgxpool.Pool, pgxpool.Conn and pgx.Tx have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// lockKey maps a name to an advisory lock key. Advisory locks share one key
// space per database; the prefix keeps ours apart from other users'.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	h.Write([]byte(strings.Join(parts, "\x00")))
	return int64(h.Sum64())
}

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// connError wraps an error of a call that could not reach the server, or
// failed before any inbox statement ran, so the message says so. An error
// PostgreSQL answered (a *pgconn.PgError) is wrapped as it is — the
// runner's policy counts it — unless it says the session ended or the
// server cannot serve (sessionEnded). Any other — the server cannot be
// reached, the connection broke, no pooled connection came before ctx's
// deadline — is an *UnavailableError, which the runner retries as
// transient.
func connError(what string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && !sessionEnded(pe) {
		return fmt.Errorf("inbox: %s: %w", what, err)
	}
	return &UnavailableError{What: what, Err: err, mark: &runner.TransientError{Err: err}}
}

// sessionEnded reports whether PostgreSQL's answer says the server, not
// the statement, is the trouble: the session ended (FATAL, PANIC: a
// shutdown or crash terminated the backends, 57P01 and 57P02), the server
// is starting or in recovery (57P03), it has no connection slot left
// (53300), or the connection failed (class 08). A statement timeout or a
// cancel (57014) is not among them: it is the statement's. Nor is a session
// the server ended, FATAL, because its transaction stayed idle longer than
// idle_in_transaction_session_timeout (25P03) or ran longer than
// transaction_timeout (25P04): that is the transaction's, and an effect that
// always outlives it is a poison record the runner's policy must be able to
// give up, not one retried without a count for ever.
func sessionEnded(pe *pgconn.PgError) bool {
	switch {
	case pe.Code == "25P03" || pe.Code == "25P04":
		return false
	case pe.Severity == "FATAL" || pe.Severity == "PANIC":
		return true
	case strings.HasPrefix(pe.Code, "08"):
		return true
	}
	switch pe.Code {
	case "57P01", "57P02", "57P03", "53300":
		return true
	}
	return false
}

// effectError is connError for a failure once the effects have begun:
// when ctx has ended — the records' handler timeout passed, or their
// callers gave up — the failure is theirs, not the database's, and counts
// against the runner's policy: an effect that always outlives its timeout
// is a poison record the policy must be able to give up.
func effectError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("inbox: %s: %w", what, err)
	}
	return connError(what, err)
}

// UnavailableError is returned by a Store's methods and handlers when
// PostgreSQL could not be used: it could not be reached, the connection
// broke before the transaction committed (a COMMIT whose outcome is
// unknown is an *InDoubtError instead), or no pooled connection came
// before ctx's deadline. Nothing was applied. It unwraps to a
// *runner.TransientError, so the runner retries the record with backoff
// without counting the attempt against its failure policy — a database
// restart does not dead-letter good records — and through it to the
// error pgx returned.
type UnavailableError struct {
	What string // what the Store was doing: "claiming t/0@5", "check", ...
	Err  error
	mark *runner.TransientError
}

func (e *UnavailableError) Error() string {
	return "inbox: " + e.What + ": cannot use PostgreSQL: " + e.Err.Error()
}

// Unwrap returns the runner.Transient mark, which unwraps to Err.
func (e *UnavailableError) Unwrap() error {
	if e.mark == nil {
		return &runner.TransientError{Err: e.Err}
	}
	return e.mark
}
