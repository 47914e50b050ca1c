//go:build integration

package integration_test

// The inbox's schema and the session settings it must not depend on:
// migrations under any default isolation level, schema names that could
// end a quoted function body, and sessions that switch the fence off or
// move the search_path.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxPoolOn returns a pool on the bed's database whose sessions start
// with the given parameters (search_path among them), closed at the end of
// the test.
func inboxPoolOn(t testing.TB, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil {
		t.Fatalf("TIDEMARK_PG_DSN: %v", err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// inboxSchemaNamed creates a schema called name (any characters) and drops
// it at the end of the test.
func inboxSchemaNamed(t testing.TB, admin *pgxpool.Pool, name string) {
	t.Helper()
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(context.Background(), "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("create schema %q: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("drop schema %q: %v", name, err)
		}
	})
}

// TestInboxMigrateUnderRepeatableRead: four replicas whose sessions
// default to REPEATABLE READ (a role's default_transaction_isolation)
// migrate one fresh schema at once. All succeed and the schema is migrated
// once: the migration runs in READ COMMITTED, so the replicas that waited
// for the lock see what the first one created.
func TestInboxMigrateUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		schema := bed.PG(t).Config().ConnConfig.RuntimeParams["search_path"]
		pool := inboxPoolOn(t, 8, map[string]string{"search_path": schema, "default_transaction_isolation": "repeatable read"})
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = inbox.Migrate(context.Background(), pool, inbox.Logger(kafkatest.Logger(t))) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, migration %d of 4 under repeatable read: %v", round, i, err)
			}
		}
		if n := inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox_migrations"); n != int64(inbox.SchemaVersion) {
			t.Fatalf("%d migration rows, want %d", n, inbox.SchemaVersion)
		}
	}
}

// TestInboxSchemaNameCannotEndTheFenceBody: the fence function's body is
// dollar-quoted and holds the schema's name. A name that contains the
// quote's tag must neither break the migration (the legal name
// svc$fence$a) nor end the body early and run what follows as SQL (with
// check_function_bodies off, the one place the body is not parsed at
// CREATE time). In both schemas the migrated inbox fences and applies.
func TestInboxSchemaNameCannotEndTheFenceBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := bed.PG(t)
	home := admin.Config().ConnConfig.RuntimeParams["search_path"]
	hostile := fmt.Sprintf("x$fence$; CREATE TABLE %s.pwned (); SELECT $fence$", home) // home is lower case: no quotes needed
	for _, name := range []string{"svc$fence$a", hostile} {
		t.Run(name, func(t *testing.T) {
			inboxSchemaNamed(t, admin, name)
			pool := inboxPoolOn(t, 4, map[string]string{"check_function_bodies": "off"})
			if err := inbox.Migrate(ctx, pool, inbox.Schema(name), inbox.Logger(kafkatest.Logger(t))); err != nil {
				t.Fatalf("Migrate in schema %q: %v", name, err)
			}
			if n := inboxCount(t, admin, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'pwned'`, home); n != 0 {
				t.Fatalf("the schema name %q ran SQL of its own: table %s.pwned exists", name, home)
			}
			tp := runner.TP{Topic: "t", Partition: 0}
			a := inboxStore(t, pool, "g", inbox.Schema(name))
			b := inboxStore(t, pool, "g", inbox.Schema(name))
			inboxTake(t, a, tp, -1)
			noop := func(context.Context, pgx.Tx, runner.Record) error { return nil }
			if err := a.Handler(noop)(ctx, inboxRec("t", 0, 1)); err != nil {
				t.Fatalf("apply in schema %q: %v", name, err)
			}
			inboxTake(t, b, tp, -1)
			if err := a.Handler(noop)(ctx, inboxRec("t", 0, 2)); !errors.Is(err, runner.ErrFenced) {
				t.Fatalf("the old owner after the bump in schema %q: %v, want ErrFenced", name, err)
			}
			q := pgx.Identifier{name, "tidemark_inbox"}.Sanitize()
			if n := inboxCount(t, admin, "SELECT count(*) FROM "+q); n != 1 {
				t.Fatalf("%d inbox rows in schema %q, want 1", n, name)
			}
		})
	}
}

// TestInboxStatementsIgnoreTheEffectsSearchPath: an effect that changes its
// session's search_path (SET, not SET LOCAL: it outlives the transaction
// on the pooled connection) does not move the inbox: the Store resolved its
// schema before, and the records that follow on that connection are
// claimed, fenced and counted in the Store's own tables.
func TestInboxStatementsIgnoreTheEffectsSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	home := inboxDB(t)
	elsewhere := inboxDB(t) // a second, migrated inbox the session is sent to
	homeSchema := home.Config().ConnConfig.RuntimeParams["search_path"]
	otherSchema := elsewhere.Config().ConnConfig.RuntimeParams["search_path"]
	one := inboxPoolOn(t, 1, map[string]string{"search_path": homeSchema})
	s := inboxStore(t, one, "g")
	tp := runner.TP{Topic: "t", Partition: 0}
	inboxTake(t, s, tp, -1)
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if rec.Offset == 1 {
			if _, err := tx.Exec(ctx, "SET search_path TO "+pgx.Identifier{otherSchema}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
	for off := int64(1); off <= 3; off++ {
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatalf("record %d after the effect moved the search_path: %v", off, err)
		}
	}
	if n := inboxCount(t, home, "SELECT count(*) FROM tidemark_inbox"); n != 3 {
		t.Fatalf("%d inbox rows in the Store's schema, want 3", n)
	}
	if n := inboxCount(t, elsewhere, "SELECT count(*) FROM tidemark_inbox"); n != 0 {
		t.Fatalf("%d inbox rows in the schema the effect moved to, want 0", n)
	}
}

// TestInboxRetentionOneRoundPerGroup: a Store given Schema(s) and one that
// finds s on its search_path are the same inbox, and their retention loops
// take turns: while one is inside its round (blocked in its CommittedFunc)
// the other never enters one.
func TestInboxRetentionOneRoundPerGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	byName := inboxStore(t, pool, "g", inbox.Schema(schema))
	byPath := inboxStore(t, pool, "g")
	inboxTake(t, byName, runner.TP{Topic: "t", Partition: 0}, -1)

	inside := make(chan string, 2)
	release := make(chan struct{})
	committed := func(name string) inbox.CommittedFunc {
		return func(ctx context.Context, tps []runner.TP) (map[runner.TP]int64, error) {
			select {
			case inside <- name:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = byName.RunRetention(rctx, 10*time.Millisecond, committed("schema option")) })
	first := <-inside
	wg.Go(func() { _ = byPath.RunRetention(rctx, 10*time.Millisecond, committed("search_path")) })
	select {
	case second := <-inside:
		t.Fatalf("the %s Store entered a retention round while the %s one was inside one", second, first)
	case <-time.After(time.Second): // about 100 rounds of the second loop
	}
	close(release)
}

// inboxHeldCommit runs rec through h on its own goroutine with an effect
// that writes its row, signals inside, and returns only when release is
// closed; it returns the channel of h's result.
func inboxHeldCommit(ctx context.Context, s *inbox.Store, rec runner.Record, before func(ctx context.Context, tx pgx.Tx) error, inside chan<- struct{}, release <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			if before != nil {
				if err := before(ctx, tx); err != nil {
					return err
				}
			}
			if err := inboxEffect("old")(ctx, tx, rec); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})(ctx, rec)
	}()
	return done
}

// TestInboxFenceWhateverTheSession: the fence holds whatever the old
// owner's session does. Under session_replication_role = replica —
// set for the whole session, or by the effect with SET LOCAL — ordinary
// triggers do not fire; the fence still does, so an old owner whose
// partition was taken while it ran its effect is fenced at commit.
func TestInboxFenceWhateverTheSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		params map[string]string
		before func(ctx context.Context, tx pgx.Tx) error
	}{
		{"session", map[string]string{"session_replication_role": "replica"}, nil},
		{"effect", nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := inboxDB(t)
			params := map[string]string{"search_path": pool.Config().ConnConfig.RuntimeParams["search_path"]}
			for k, v := range tc.params {
				params[k] = v
			}
			oldPool := inboxPoolOn(t, 2, params)
			tp := runner.TP{Topic: "t", Partition: 0}
			old := inboxStore(t, oldPool, "g", inbox.Owner("old"))
			next := inboxStore(t, pool, "g", inbox.Owner("new"))
			inboxTake(t, old, tp, -1)
			inside, release := make(chan struct{}), make(chan struct{})
			done := inboxHeldCommit(ctx, old, inboxRec("t", 0, 7), tc.before, inside, release)
			<-inside
			inboxTake(t, next, tp, -1)
			close(release)
			if err := <-done; !errors.Is(err, runner.ErrFenced) {
				t.Fatalf("the old owner's commit after the bump: %v, want ErrFenced", err)
			}
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 0 {
				t.Fatalf("%d effects committed by a fenced owner", n)
			}
		})
	}
}

// inboxSchemaV1 is schema version 1 as the first release created it, and
// the statements its builds send, for the upgrade test.
const (
	// inboxV1FenceBody is the body of version 1's fence function: the
	// lease row FOR SHARE at every isolation level. BenchmarkInboxFence
	// puts it back (inboxRowLockFence) to compare.
	inboxV1FenceBody = `
DECLARE
	current bigint;
BEGIN
	SELECT l.epoch INTO current FROM tidemark_lease l
	 WHERE l.group_id = NEW.group_id AND l.topic = NEW.topic AND l.partition = NEW.partition
	   FOR SHARE;
	IF current IS DISTINCT FROM NEW.epoch THEN
		RAISE EXCEPTION USING ERRCODE = 'TM001', MESSAGE = 'fenced';
	END IF;
	RETURN NULL;
END
`
	inboxSchemaV1 = `
CREATE TABLE tidemark_inbox_migrations (version integer PRIMARY KEY, description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
INSERT INTO tidemark_inbox_migrations (version, description) VALUES (1, 'inbox rows, partition leases, the commit-time fence');
CREATE TABLE tidemark_lease (
	group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, epoch bigint NOT NULL,
	owner text NOT NULL, acquired_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (group_id, topic, partition));
CREATE TABLE tidemark_inbox (
	group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL,
	epoch bigint NOT NULL, dedup_key text, applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (group_id, topic, partition, "offset"));
CREATE UNIQUE INDEX tidemark_inbox_dedup ON tidemark_inbox (group_id, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE FUNCTION tidemark_inbox_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$` + inboxV1FenceBody + `$fence$;
CREATE CONSTRAINT TRIGGER tidemark_inbox_fence AFTER INSERT ON tidemark_inbox
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tidemark_inbox_fence();`
	inboxV1Bump = `INSERT INTO tidemark_lease AS l (group_id, topic, partition, epoch, owner, acquired_at)
VALUES ($1, $2, $3, 1, $4, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE
	SET epoch = l.epoch + 1, owner = EXCLUDED.owner, acquired_at = now()
RETURNING epoch`
	inboxV1Claim = `WITH lease AS (
	SELECT epoch FROM tidemark_lease WHERE group_id = $1 AND topic = $2 AND partition = $3
), claimed AS (
	INSERT INTO tidemark_inbox (group_id, topic, partition, "offset", epoch, dedup_key)
	SELECT $1, $2, $3, $4::bigint, lease.epoch, $6::text FROM lease WHERE lease.epoch = $5::bigint
	ON CONFLICT DO NOTHING
	RETURNING 1
)
SELECT (SELECT epoch FROM lease), EXISTS (SELECT FROM claimed)`
)

// inboxV1Apply applies a record as a build of version 1 does, and returns
// whether its row went in.
func inboxV1Apply(t *testing.T, pool *pgxpool.Pool, epoch, offset int64, key string) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var cur *int64
	var claimed bool
	if err := tx.QueryRow(ctx, inboxV1Claim, "g", "t", 0, offset, epoch, key).Scan(&cur, &claimed); err != nil {
		t.Fatalf("version 1 claim of offset %d: %v", offset, err)
	}
	if !claimed {
		return false
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("version 1 commit of offset %d: %v", offset, err)
	}
	return true
}

// TestInboxUpgradeFromVersion1: a database migrated and used by a build of
// version 1 migrates to this version with its rows, and during the rolling
// upgrade the two builds' dedup keys find each other: a key a version 1
// build wrote before or after the migration is a replay for this build,
// and one this build wrote is one for a version 1 build. A version 1
// build's bump still fences this build's old owner.
func TestInboxUpgradeFromVersion1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := bed.PG(t)
	if _, err := pool.Exec(ctx, inboxSchemaV1+"\n"+inboxEffectsDDL); err != nil {
		t.Fatal(err)
	}
	var epoch int64
	if err := pool.QueryRow(ctx, inboxV1Bump, "g", "t", 0, "v1").Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if !inboxV1Apply(t, pool, epoch, 1, "m-before") {
		t.Fatal("version 1 could not apply its record")
	}
	if err := inbox.Migrate(ctx, pool, inbox.Logger(kafkatest.Logger(t))); err != nil {
		t.Fatalf("Migrate from version 1: %v", err)
	}
	if !inboxV1Apply(t, pool, epoch, 2, "m-during") {
		t.Fatal("version 1 could not apply a record after the migration")
	}
	inboxUpgraded(t, pool)

	s := inboxStore(t, pool, "g", inbox.DedupHeader("message-id"))
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	h := s.Handler(inboxEffect("v2"))
	for i, id := range []string{"m-before", "m-during", "m-new"} {
		r := inboxRec("t", 0, int64(10+i))
		r.Headers = []runner.Header{{Key: "message-id", Value: []byte(id)}}
		if err := h(ctx, r); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("%d effects, want 1 (m-new; the keys version 1 wrote are replays)", n)
	}
	if st := s.Stats(); st.Replays != 2 {
		t.Fatalf("%d replays, want 2", st.Replays)
	}
	// A version 1 build meets this build's key.
	var v1Epoch int64
	if err := pool.QueryRow(ctx, inboxV1Bump, "g", "t", 0, "v1").Scan(&v1Epoch); err != nil {
		t.Fatal(err)
	}
	if inboxV1Apply(t, pool, v1Epoch, 20, "m-new") {
		t.Fatal("version 1 applied a key this build had applied")
	}
	// That bump fenced this build.
	if err := h(ctx, inboxRec("t", 0, 21)); !errors.Is(err, runner.ErrFenced) {
		t.Fatalf("this build after version 1's bump: %v, want ErrFenced", err)
	}
}
