//go:build integration

package bed

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PG returns a pgx pool on the test bed's PostgreSQL (TIDEMARK_PG_DSN) whose
// connections all use a schema created for this call: unqualified names
// resolve in it and tables created without a schema land in it (search_path
// is set as a connection parameter). The schema's name is
// pool.Config().ConnConfig.RuntimeParams["search_path"], and the sessions'
// application_name too (unless the DSN names one): tests that look at
// pg_stat_activity or pg_locks count only their own sessions with
// application_name = current_setting('application_name'). In the test's
// cleanup the pool is closed and the schema dropped with all it holds.
//
// When TIDEMARK_PG_DSN is missing or the server does not answer, PG fails
// the test with t.Fatalf and a hint on how to start the bed; it never skips.
func PG(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := os.Getenv("TIDEMARK_PG_DSN")
	if dsn == "" {
		t.Fatalf("bed: TIDEMARK_PG_DSN is not set; %s", StartHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()

	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("bed: PostgreSQL at TIDEMARK_PG_DSN does not answer: %v; %s", err, StartHint)
	}
	defer admin.Close(context.Background())
	// Lower case: PostgreSQL folds unquoted identifiers, and a schema name
	// someone types into psql while debugging should just work.
	schema := strings.ToLower(strings.ReplaceAll(Name(t, "t"), "-", "_"))
	schema = strings.ReplaceAll(schema, ".", "_")
	if len(schema) > 63 { // NAMEDATALEN-1; keep the random suffix
		schema = schema[:54] + schema[len(schema)-9:]
	}
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("bed: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("bed: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("bed: drop schema %s: %v", schema, err)
		}
	})

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("bed: TIDEMARK_PG_DSN: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	// The schema's name as the sessions' application_name (unless the
	// DSN sets one), so that a test can tell its own sessions in
	// pg_stat_activity from those of the tests running beside it.
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = schema
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("bed: pgx pool: %v", err)
	}
	// Registered after the schema's cleanup, so it runs before it: the pool
	// is closed before its schema is dropped.
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("bed: pgx pool ping: %v; %s", err, StartHint)
	}
	return pool
}
