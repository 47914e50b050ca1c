// Package inboxcmd is `tidemark inbox`: operations on the PostgreSQL schema
// of pkg/inbox.
package inboxcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// Exit statuses.
const (
	ExitOK    = 0
	ExitError = 1
)

// Migrate runs `tidemark inbox migrate` with args (the words after
// "migrate") and returns the process's exit status: 0 when the schema is at
// inbox.SchemaVersion afterwards, 1 for a usage error or a failure, which
// it explains on stderr.
func Migrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tidemark inbox migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "PostgreSQL connection `string` (URL or key=value), required")
	schema := fs.String("schema", "", "schema of the inbox's tables (default: the first of the DSN's search_path)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long, waiting for the server and for other replicas' migrations")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: tidemark inbox migrate --dsn DSN [--schema NAME] [--timeout D]

Creates or upgrades the tables of tidemark's inbox (tidemark_inbox,
tidemark_lease, tidemark_inbox_migrations) to version %d. Safe to run
again, and from many places at once: replicas serialize on an advisory
lock and the later ones find nothing to do. Exit status 1 on any error.

`, inbox.SchemaVersion)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitError
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tidemark inbox migrate: "+format+"\n", a...)
		return ExitError
	}
	switch {
	case fs.NArg() > 0:
		return fail("unexpected argument %q", fs.Arg(0))
	case *dsn == "":
		return fail("--dsn is required")
	case *timeout <= 0:
		return fail("--timeout %v is not positive", *timeout)
	}
	cfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		// pgx's message may quote the DSN, password included: say only
		// what is wrong with it.
		return fail("--dsn is not a valid connection string")
	}
	cfg.MaxConns = 2
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail("%v", err)
	}
	defer pool.Close()

	var opts []inbox.Option
	if *schema != "" {
		opts = append(opts, inbox.Schema(*schema))
	}
	opts = append(opts, inbox.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	before, err := inbox.Version(ctx, pool, opts...)
	if err != nil {
		return fail("%v", err)
	}
	name := *schema
	if name == "" {
		var cur *string
		if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err == nil && cur != nil {
			name = *cur
		}
	}
	if err := inbox.Migrate(ctx, pool, opts...); err != nil {
		return fail("%v", err)
	}
	after, err := inbox.Version(ctx, pool, opts...)
	if err != nil {
		return fail("%v", err)
	}
	if after == before {
		fmt.Fprintf(stdout, "tidemark inbox migrate: schema %s already at version %d\n", name, after)
	} else {
		fmt.Fprintf(stdout, "tidemark inbox migrate: migrated schema %s to version %d (was %d)\n", name, after, before)
	}
	return ExitOK
}
