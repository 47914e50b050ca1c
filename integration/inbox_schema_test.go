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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
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
	for round := range 3 {
		schema := bed.PG(t).Config().ConnConfig.RuntimeParams["search_path"]
		pool := inboxPoolOn(t, 8, map[string]string{"search_path": schema, "default_transaction_isolation": "repeatable read"})
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = inbox.Migrate(context.Background(), pool, inbox.Logger(quietLogger())) })
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
	ctx := context.Background()
	admin := bed.PG(t)
	home := admin.Config().ConnConfig.RuntimeParams["search_path"]
	hostile := fmt.Sprintf("x$fence$; CREATE TABLE %s.pwned (); SELECT $fence$", home) // home is lower case: no quotes needed
	for _, name := range []string{"svc$fence$a", hostile} {
		t.Run(name, func(t *testing.T) {
			inboxSchemaNamed(t, admin, name)
			pool := inboxPoolOn(t, 4, map[string]string{"check_function_bodies": "off"})
			if err := inbox.Migrate(ctx, pool, inbox.Schema(name), inbox.Logger(quietLogger())); err != nil {
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
