// Package inboxcmd is `tidemark inbox`: operations on the PostgreSQL schema
// of pkg/inbox — migrate it, list and reset a group's partition leases.
package inboxcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/cli"
	"github.com/tidemark/tidemark/pkg/inbox"
)

// dsnHelp is the part of every command's usage that says where the
// connection string comes from.
const dsnHelp = `The database is --dsn, else $TIDEMARK_PG_DSN, else libpq's variables
(PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGPASSFILE, PGSERVICE,
PGSSLMODE, ...). Prefer a variable or a password file to --dsn: a password
in the arguments is visible to every user of the machine (ps).
`

// libpqVars are the variables that name a server without a connection
// string; one of them set means "connect as libpq would".
var libpqVars = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// common are the flags every inbox command has, and where it explains a
// failure.
type common struct {
	name    string // "tidemark inbox migrate"
	stdout  io.Writer
	stderr  io.Writer
	fs      *flag.FlagSet
	dsn     *string
	schema  *string
	timeout *time.Duration
}

func newCommon(name string, stdout, stderr io.Writer) *common {
	fs := cli.NewFlagSet("tidemark inbox " + name)
	return &common{
		name:    "tidemark inbox " + name,
		stdout:  stdout,
		stderr:  stderr,
		fs:      fs,
		dsn:     fs.String("dsn", "", "PostgreSQL connection `string` (URL or key=value); default $TIDEMARK_PG_DSN, else libpq's PG* variables"),
		schema:  fs.String("schema", "", "schema of the inbox's tables (default: the first of the search_path)"),
		timeout: fs.Duration("timeout", time.Minute, "give up after this long"),
	}
}

// usageError is a connect error that is the command line's (or the
// environment's) fault: no database named, or a connection string that
// does not parse.
type usageError string

func (e usageError) Error() string { return string(e) }

// connect opens a small pool on the command's database. The error never
// holds the connection string: pgx's parse errors may quote it, password
// included. A usageError is a usage error.
func (c *common) connect(ctx context.Context) (*pgxpool.Pool, error) {
	dsn, from := *c.dsn, "--dsn"
	if dsn == "" {
		dsn, from = os.Getenv("TIDEMARK_PG_DSN"), "TIDEMARK_PG_DSN"
	}
	if dsn == "" {
		from = "libpq's PG* variables"
		set := false
		for _, v := range libpqVars {
			if os.Getenv(v) != "" {
				set = true
			}
		}
		if !set {
			return nil, usageError("no database: pass --dsn, set TIDEMARK_PG_DSN, or set libpq's variables (PGHOST, PGDATABASE, PGUSER, ...)")
		}
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usageError(from + " is not a valid connection string")
	}
	cfg.MaxConns = 2
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (c *common) options() []inbox.Option {
	opts := []inbox.Option{inbox.Logger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	if *c.schema != "" {
		opts = append(opts, inbox.Schema(*c.schema))
	}
	return opts
}

// parse parses args; done reports that the command ends with status code
// (help, or a usage error already explained).
func (c *common) parse(args []string) (code int, done bool) {
	if code, done := cli.Parse(c.fs, args, c.stdout, c.stderr); done {
		return code, true
	}
	switch {
	case c.fs.NArg() > 0:
		return c.usage("unexpected argument %q", c.fs.Arg(0)), true
	case *c.timeout <= 0:
		return c.usage("--timeout %v is not positive", *c.timeout), true
	}
	return 0, false
}

// fail explains a failure on stderr, after the command's name, and returns
// cli.ExitFailure.
func (c *common) fail(format string, a ...any) int {
	return cli.Failf(c.stderr, c.name, format, a...)
}

// usage explains a usage error on stderr and returns cli.ExitUsage.
func (c *common) usage(format string, a ...any) int {
	return cli.Usagef(c.stderr, c.name, format, a...)
}

// withPool runs f with a pool on the command's database and a ctx that ends
// after --timeout, and returns f's status; explained, cli.ExitUsage if no
// database is named or its connection string does not parse,
// cli.ExitFailure if the pool cannot be made.
func (c *common) withPool(f func(ctx context.Context, pool *pgxpool.Pool) int) int {
	ctx, cancel := context.WithTimeout(context.Background(), *c.timeout)
	defer cancel()
	pool, err := c.connect(ctx)
	if ue, ok := errors.AsType[usageError](err); ok {
		return c.usage("%v", ue)
	}
	if err != nil {
		return c.fail("%v", err)
	}
	defer pool.Close()
	return f(ctx, pool)
}

// Migrate runs `tidemark inbox migrate` with args (the words after
// "migrate") and returns the process's exit status: 0 when the schema is at
// inbox.SchemaVersion afterwards, 2 for a usage error, 1 for a failure,
// which it explains on stderr.
func Migrate(args []string, stdout, stderr io.Writer) int {
	c := newCommon("migrate", stdout, stderr)
	c.fs.Usage = func() {
		fmt.Fprintf(c.fs.Output(), `usage: tidemark inbox migrate [--dsn DSN] [--schema NAME] [--timeout D]

Creates or upgrades the tables of tidemark's inbox (tidemark_inbox,
tidemark_lease, tidemark_inbox_retention, tidemark_inbox_bounds,
tidemark_inbox_migrations) to
version %d. Safe to run again, and from many places at once: replicas
serialize on an advisory lock and the later ones find nothing to do. Exit
status 2 for a usage error (no database named, a bad flag), 1 for a
failure.

%s
`, inbox.SchemaVersion, dsnHelp)
		c.fs.PrintDefaults()
	}
	if code, done := c.parse(args); done {
		return code
	}
	return c.withPool(func(ctx context.Context, pool *pgxpool.Pool) int {
		opts := c.options()
		before, err := inbox.Version(ctx, pool, opts...)
		if err != nil {
			return c.fail("%v", err)
		}
		name := *c.schema
		if name == "" {
			var cur *string
			if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err == nil && cur != nil {
				name = *cur
			}
		}
		if err := inbox.Migrate(ctx, pool, opts...); err != nil {
			return c.fail("%v", err)
		}
		after, err := inbox.Version(ctx, pool, opts...)
		if err != nil {
			return c.fail("%v", err)
		}
		if after == before {
			fmt.Fprintf(stdout, "tidemark inbox migrate: schema %s already at version %d\n", name, after)
		} else {
			fmt.Fprintf(stdout, "tidemark inbox migrate: migrated schema %s to version %d (was %d)\n", name, after, before)
		}
		return cli.ExitOK
	})
}

// Leases runs `tidemark inbox leases` with args (the words after "leases"):
// it lists a group's partition leases, and with --reset --yes bumps them
// all (inbox.ResetLeases). It returns 0 on success, 2 for a usage error or
// --reset without --yes (which lists and changes nothing), 1 for a
// failure.
func Leases(args []string, stdout, stderr io.Writer) int {
	c := newCommon("leases", stdout, stderr)
	group := c.fs.String("group", "", "the consumer group, required")
	topic := c.fs.String("topic", "", "only this topic's leases")
	reset := c.fs.Bool("reset", false, "bump every listed lease's epoch, fencing the members that hold them (needs --yes)")
	yes := c.fs.Bool("yes", false, "confirm --reset")
	c.fs.Usage = func() {
		fmt.Fprintf(c.fs.Output(), `usage: tidemark inbox leases --group G [--topic T] [--reset --yes] [--dsn DSN] [--schema NAME]

Lists the group's partition leases: epoch, the Store's owner, the Kafka
member id of the assignment it took the lease for (compare with
kafka-consumer-groups --describe --members), when, and the partition's
applied low-water mark.

--reset --yes bumps every listed lease, so that no member holds one: each
running member's next commit on those partitions is fenced. A member with
inbox.Owners takes back, on its next record, the lease of a partition the
group coordinator says it owns; other members at their next assignment.
Use it to stop a member you cannot stop (a zombie process) from
committing. Applied marks are kept. Without --yes it only says what it
would reset, and exits 2 (a usage error: the confirmation is missing).
Otherwise exit status 2 means a usage error, 1 a failure.

%s
`, dsnHelp)
		c.fs.PrintDefaults()
	}
	if code, done := c.parse(args); done {
		return code
	}
	switch {
	case *group == "":
		return c.usage("--group is required")
	case *yes && !*reset:
		return c.usage("--yes confirms --reset; there is nothing to confirm")
	}
	return c.withPool(func(ctx context.Context, pool *pgxpool.Pool) int {
		leases, err := inbox.Leases(ctx, pool, *group, *topic, c.options()...)
		if err != nil {
			return c.fail("%v", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tEPOCH\tOWNER\tMEMBER\tACQUIRED\tAPPLIED BELOW")
		for _, l := range leases {
			member := l.Member
			if member == "" {
				member = "-"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\n", l.Topic, l.Partition, l.Epoch, l.Owner, member,
				l.Acquired.UTC().Format(time.RFC3339), l.AppliedBelow)
		}
		tw.Flush()
		if !*reset {
			return cli.ExitOK
		}
		if !*yes {
			return c.usage("would reset the %d leases above, fencing the members that hold them; run again with --yes", len(leases))
		}
		n, err := inbox.ResetLeases(ctx, pool, *group, *topic, c.options()...)
		if err != nil {
			return c.fail("%v", err)
		}
		fmt.Fprintf(stdout, "tidemark inbox leases: reset %d leases of group %s\n", n, *group)
		return cli.ExitOK
	})
}
