//go:build integration

package integration_test

// The inbox's schema and the session settings it must not depend on:
// migrations under any default isolation level, schema names that could
// end a quoted function body, and sessions that switch the fence off or
// move the search_path.

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/inbox"
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
