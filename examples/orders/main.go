// Command orders is a tidemark service a user can copy: it consumes JSON
// order events keyed by customer from a Kafka topic and applies each one
// through the PostgreSQL inbox — the order row and the customer's running
// total in one transaction with the inbox row — so a replay changes nothing.
// It serves /livez, /readyz, /statusz, the status page /tidemark (and
// /tidemark.json) and /metrics (Prometheus), and stops
// gracefully on SIGTERM within TIDEMARK_SHUTDOWN_BUDGET. The probes are
// served from the start: while PostgreSQL or Kafka cannot be reached the
// process waits, /readyz 503 naming what it waits for.
//
// Configuration (flag, or the environment variable in brackets):
//
//	-brokers     Kafka seed brokers, comma-separated [TIDEMARK_KAFKA_BROKERS]
//	-dsn         PostgreSQL connection string [TIDEMARK_PG_DSN] (never printed;
//	             refused with a password in it: argv is visible to all)
//	-group       consumer group (default orders) [ORDERS_GROUP]
//	-topic       topic (default orders) [ORDERS_TOPIC]
//	-dlq         dead-letter topic for malformed orders (default orders.dlq) [ORDERS_DLQ]
//	-http        probe and metrics address (default :8080) [ORDERS_HTTP]
//	-concurrency handlers at once (default 64) [ORDERS_CONCURRENCY]
//	-instance-id static group membership id, e.g. the pod name [ORDERS_INSTANCE_ID]
//	-delay       extra latency per order, for demos and tests (default 0) [ORDERS_DELAY]
//	-session-timeout  group session timeout (default 10s) [ORDERS_SESSION_TIMEOUT]
//	-mode        group (a consumer group, default) or share (a share group,
//	             KIP-932: Kafka 4.2+) [ORDERS_MODE]
//	-share-lock  share mode: the group's acquisition lock
//	             (share.record.lock.duration.ms; default 0: the broker's) [ORDERS_SHARE_LOCK]
//	-controls    serve the status page's pause and resume controls (default
//	             false): an admin surface on the -http address, which must
//	             then be reachable by operators only [ORDERS_CONTROLS]
//	-metadata-max-age  how often the Kafka client refreshes its metadata,
//	             and so how soon it sees partitions added to the topic
//	             (default 0: franz-go's, 5m) [ORDERS_METADATA_MAX_AGE]
//	-kafka-dial  for tests: broker=address,… — dial each broker address
//	             (seed or advertised) at the address given instead, e.g. a
//	             proxy; an address it does not name is not dialed (default
//	             none: dial the brokers themselves) [ORDERS_KAFKA_DIAL]
//	-effect      idempotent (default) or strict, a test effect [ORDERS_EFFECT]
//
// The default effect is idempotent by itself: a second application of an
// order changes nothing, whatever the inbox does. The strict effect is for
// the tests that check the inbox (integration/chaos, make demo): it also
// appends one row per application to an applications table (the order,
// its record's topic, partition and offset, the process id, the time) and
// adds every application to the customer's totals, so a record applied
// twice shows as two rows and a wrong total. Do not copy it into a service.
//
// In share mode -group names a share group; every process reads every
// partition, the inbox row alone makes a redelivered order a replay (no
// lease: inbox.ShareGroup), orders of one customer are applied in no
// particular order, and retention prunes below the share-partition start
// offsets (see docs/inbox.md).
//
// A malformed order goes to the dead-letter topic after 5 attempts. Any
// other failure — the database down or restarting, a connection lost — is
// not the order's fault: the handler retries it itself with backoff until
// it succeeds or the partition is taken away, so an outage never
// dead-letters good orders.
//
// Exit status: 0 after a clean stop, 3 when the drain budget ran out (the
// unfinished orders are left to the next owner; nothing is lost), 4 when a
// second signal forced the stop (the process then exits within a second,
// whether or not its handlers have returned), 1 on any other error, 2 on
// bad configuration.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/share"
	"github.com/tidemark/tidemark/pkg/status"
)

// Order is one order event, the value of a record keyed by Customer.
type Order struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

type config struct {
	brokers     []string
	dsn         string
	group       string
	topic       string
	dlq         string
	http        string
	concurrency int
	instanceID  string
	delay       time.Duration
	session     time.Duration
	budget      time.Duration
	share       bool
	shareLock   time.Duration
	controls    bool
	strict      bool // -effect strict
	// unsafeInbox is the inbox's test hook, from unsafeInboxOptions: only
	// ever set in a tidemark_unsafe build.
	unsafeInbox []inbox.Option
	metaMaxAge  time.Duration
	kafkaDial   map[string]string // broker address → address dialed
	maxBuffered int64             // runner.MaxBufferedBytes; 0: the runner's default
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if cfg.unsafeInbox, err = unsafeInboxOptions(log); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(2)
	}
	os.Exit(run(cfg, log))
}

// dsnHasPassword reports whether a connection string, URL
// (postgres://user:pw@host) or key=value (password=pw), carries a
// password. A string that parses as neither is left to the connection
// setup, whose error does not quote it.
func dsnHasPassword(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			_, set := u.User.Password()
			return set || u.Query().Has("password")
		}
		// Unparsable: look for user:password@ by hand.
		rest := dsn[strings.Index(dsn, "://")+3:]
		at := strings.LastIndex(rest, "@")
		return at >= 0 && strings.Contains(rest[:at], ":")
	}
	for _, f := range strings.Fields(dsn) {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == "password" {
			return true
		}
	}
	return false
}

// parseBytes reads a byte count as GOMEMLIMIT writes one: a positive
// integer with an optional unit B, KiB, MiB, GiB or TiB (128MiB).
func parseBytes(s string) (int64, error) {
	mult, num := int64(1), s
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			mult, num = u.mult, strings.TrimSuffix(s, u.suffix)
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return 0, errors.New("want a positive number of bytes with an optional unit B, KiB, MiB, GiB or TiB (e.g. 128MiB)")
	}
	return n * mult, nil
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func parseConfig(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(out)
	var c config
	brokers := fs.String("brokers", env("TIDEMARK_KAFKA_BROKERS", ""), "Kafka seed brokers, comma-separated")
	// Not env(...) as the default: the usage text prints a flag's default,
	// and the connection string holds the password.
	fs.StringVar(&c.dsn, "dsn", "", "PostgreSQL connection string (default $TIDEMARK_PG_DSN; prefer the variable: argv is visible to every user of the machine)")
	fs.StringVar(&c.group, "group", env("ORDERS_GROUP", "orders"), "consumer group")
	fs.StringVar(&c.topic, "topic", env("ORDERS_TOPIC", "orders"), "topic")
	fs.StringVar(&c.dlq, "dlq", env("ORDERS_DLQ", "orders.dlq"), "dead-letter topic")
	fs.StringVar(&c.http, "http", env("ORDERS_HTTP", ":8080"), "probe and metrics address")
	conc := fs.String("concurrency", env("ORDERS_CONCURRENCY", "64"), "handlers at once")
	fs.StringVar(&c.instanceID, "instance-id", env("ORDERS_INSTANCE_ID", ""), "static membership id")
	delay := fs.String("delay", env("ORDERS_DELAY", "0s"), "extra latency per order")
	session := fs.String("session-timeout", env("ORDERS_SESSION_TIMEOUT", "10s"), "group session timeout")
	mode := fs.String("mode", env("ORDERS_MODE", "group"), "group (consumer group) or share (share group)")
	shareLock := fs.String("share-lock", env("ORDERS_SHARE_LOCK", "0s"), "share mode: the group's acquisition lock (0: the broker's)")
	controls := fs.String("controls", env("ORDERS_CONTROLS", "false"), "serve the status page's pause and resume controls (an admin surface)")
	effect := fs.String("effect", env("ORDERS_EFFECT", "idempotent"), "idempotent, or strict: a test effect that records every application (see the package doc)")
	metaMaxAge := fs.String("metadata-max-age", env("ORDERS_METADATA_MAX_AGE", "0s"), "Kafka metadata refresh interval (0: franz-go's, 5m)")
	maxBuffered := fs.String("max-buffered-bytes", env("ORDERS_MAX_BUFFERED_BYTES", ""), "the most the runner holds for records (runner.MaxBufferedBytes), such as 128MiB (empty: the runner's 256MiB); size GOMEMLIMIT from it")
	kafkaDial := fs.String("kafka-dial", env("ORDERS_KAFKA_DIAL", ""), "for tests: broker=address,… dial each broker at the address given")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.controls, err = strconv.ParseBool(*controls); err != nil {
		return c, fmt.Errorf("-controls / ORDERS_CONTROLS %q: want true or false", *controls)
	}
	switch *effect {
	case "idempotent":
	case "strict":
		c.strict = true
	default:
		return c, fmt.Errorf("-effect / ORDERS_EFFECT %q: want idempotent or strict", *effect)
	}
	switch *mode {
	case "group":
	case "share":
		c.share = true
	default:
		return c, fmt.Errorf("-mode / ORDERS_MODE %q: want group or share", *mode)
	}
	if c.dsn != "" && dsnHasPassword(c.dsn) {
		return c, errors.New("-dsn holds a password, which argv shows to every user of the machine (ps, /proc): put the connection string in TIDEMARK_PG_DSN, or the password in PGPASSWORD or a passfile")
	}
	if c.dsn == "" {
		c.dsn = env("TIDEMARK_PG_DSN", "")
	}
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.brokers = append(c.brokers, b)
		}
	}
	switch {
	case len(c.brokers) == 0:
		return c, errors.New("no brokers: set -brokers or TIDEMARK_KAFKA_BROKERS")
	case c.dsn == "":
		return c, errors.New("no database: set -dsn or TIDEMARK_PG_DSN")
	case c.group == "" || c.topic == "" || c.dlq == "":
		return c, errors.New("-group, -topic and -dlq must not be empty")
	}
	if c.concurrency, err = strconv.Atoi(*conc); err != nil || c.concurrency < 1 {
		return c, fmt.Errorf("-concurrency / ORDERS_CONCURRENCY %q: want a positive integer", *conc)
	}
	if c.delay, err = time.ParseDuration(*delay); err != nil || c.delay < 0 {
		return c, fmt.Errorf("-delay / ORDERS_DELAY %q: want a duration such as 5ms", *delay)
	}
	if c.session, err = time.ParseDuration(*session); err != nil || c.session < time.Second {
		return c, fmt.Errorf("-session-timeout / ORDERS_SESSION_TIMEOUT %q: want a duration of at least 1s", *session)
	}
	if c.shareLock, err = time.ParseDuration(*shareLock); err != nil || c.shareLock < 0 {
		return c, fmt.Errorf("-share-lock / ORDERS_SHARE_LOCK %q: want a duration such as 30s", *shareLock)
	}
	if c.metaMaxAge, err = time.ParseDuration(*metaMaxAge); err != nil || c.metaMaxAge < 0 {
		return c, fmt.Errorf("-metadata-max-age / ORDERS_METADATA_MAX_AGE %q: want a duration such as 10s", *metaMaxAge)
	}
	if *maxBuffered != "" {
		if c.maxBuffered, err = parseBytes(*maxBuffered); err != nil {
			return c, fmt.Errorf("-max-buffered-bytes / ORDERS_MAX_BUFFERED_BYTES %q: %v", *maxBuffered, err)
		}
	}
	if c.kafkaDial, err = parseDialMap(*kafkaDial); err != nil {
		return c, err
	}
	if c.budget, err = shutdown.BudgetFromEnv(); err != nil {
		return c, err
	}
	if _, _, err := net.SplitHostPort(c.http); err != nil {
		return c, fmt.Errorf("-http / ORDERS_HTTP %q: %v", c.http, err)
	}
	return c, nil
}

// parseDialMap parses -kafka-dial: comma-separated broker=address pairs,
// each a host:port.
func parseDialMap(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		from, to, ok := strings.Cut(strings.TrimSpace(pair), "=")
		_, _, errFrom := net.SplitHostPort(from)
		_, _, errTo := net.SplitHostPort(to)
		if !ok || errFrom != nil || errTo != nil {
			return nil, fmt.Errorf("-kafka-dial / ORDERS_KAFKA_DIAL: %q is not broker=address, both host:port", pair)
		}
		m[from] = to
	}
	return m, nil
}

// clientOpts are the franz-go options every Kafka client of the service
// shares: the metadata refresh interval, and the -kafka-dial dialer.
func clientOpts(cfg config) []kgo.Opt {
	var opts []kgo.Opt
	if cfg.metaMaxAge > 0 {
		opts = append(opts, kgo.MetadataMaxAge(cfg.metaMaxAge))
	}
	if cfg.kafkaDial != nil {
		var d net.Dialer
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			to, ok := cfg.kafkaDial[addr]
			if !ok {
				// Strict: a test that routes the brokers through a
				// proxy must not be bypassed by an address it missed.
				return nil, fmt.Errorf("-kafka-dial names no address for broker %s", addr)
			}
			return d.DialContext(ctx, network, to)
		}))
	}
	return opts
}

// Schema is the example's business tables; the inbox has its own. An
// order's seq is taken from a sequence when its row is inserted: one
// customer's orders are applied one at a time, so ordered by seq they are in
// the order they were applied (integration/chaos checks it against their
// offsets).
const Schema = `
CREATE TABLE IF NOT EXISTS orders (
	id           text PRIMARY KEY,
	customer     text NOT NULL,
	amount_cents bigint NOT NULL,
	topic        text NOT NULL,
	part         int NOT NULL,
	"offset"     bigint NOT NULL,
	applied_at   timestamptz NOT NULL DEFAULT now(),
	seq          bigserial NOT NULL
);
CREATE TABLE IF NOT EXISTS customer_totals (
	customer     text PRIMARY KEY,
	orders       bigint NOT NULL,
	total_cents  bigint NOT NULL
);`

// StrictSchema is the strict effect's table (-effect strict): one row per
// application of a record, with no key but its own sequence, so that a
// record applied twice leaves two rows. pid is the process that applied it.
const StrictSchema = `
CREATE TABLE IF NOT EXISTS applications (
	seq          bigserial PRIMARY KEY,
	order_id     text NOT NULL,
	topic        text NOT NULL,
	part         int NOT NULL,
	"offset"     bigint NOT NULL,
	pid          int NOT NULL,
	applied_at   timestamptz NOT NULL DEFAULT now()
);`

// createTables creates the business tables (with strict, the strict
// effect's too) under an advisory lock: replicas starting together would
// otherwise race in CREATE TABLE IF NOT EXISTS, which PostgreSQL answers
// with a unique violation on pg_type.
func createTables(ctx context.Context, pool *pgxpool.Pool, strict bool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('tidemark-orders-schema'))`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, Schema); err != nil {
		return err
	}
	if strict {
		if _, err := tx.Exec(ctx, StrictSchema); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// errMalformed marks an order that no retry can apply.
var errMalformed = errors.New("malformed order")

// apply writes one order's effect in the inbox's transaction. A malformed
// order is a permanent error: the DeadLetter policy parks it at once. A
// database that cannot be reached is the inbox's transient error, retried
// without counting, so a restart dead-letters nothing.
func apply(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
	o, err := decode(rec)
	if err != nil {
		return err
	}
	// A second record with the same order id is a producer retry, not a new
	// order: the primary key makes it a no-op for the totals as well.
	tag, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, amount_cents, topic, part, "offset")
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING`,
		o.ID, o.Customer, o.AmountCents, rec.Topic, rec.Partition, rec.Offset)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	_, err = tx.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total_cents) VALUES ($1, 1, $2)
		ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1,
		total_cents = customer_totals.total_cents + EXCLUDED.total_cents`, o.Customer, o.AmountCents)
	return err
}

// decode reads the order of rec; a malformed one is a permanent error.
func decode(rec runner.Record) (Order, error) {
	var o Order
	if err := json.Unmarshal(rec.Value, &o); err != nil {
		return o, runner.Permanent(fmt.Errorf("order %s: %w: %w", rec.String(), errMalformed, err))
	}
	if o.ID == "" || o.Customer == "" {
		return o, runner.Permanent(fmt.Errorf("order %s: %w: missing id or customer", rec.String(), errMalformed))
	}
	return o, nil
}

// applyStrict is the strict effect (-effect strict), a test effect that is
// not idempotent by itself: every call appends an applications row and adds
// the order to its customer's totals, whether or not the order's row was
// there already, so only the inbox stands between a replay and a second
// application. The order row is still written once (ON CONFLICT DO
// NOTHING): its seq is the key-order check's. One statement, one round
// trip: PostgreSQL runs every data-modifying WITH clause.
func applyStrict(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
	o, err := decode(rec)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `WITH ord AS (
	INSERT INTO orders (id, customer, amount_cents, topic, part, "offset")
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING
), app AS (
	INSERT INTO applications (order_id, topic, part, "offset", pid) VALUES ($1, $4, $5, $6, $7)
)
INSERT INTO customer_totals (customer, orders, total_cents) VALUES ($2, 1, $3)
ON CONFLICT (customer) DO UPDATE SET orders = customer_totals.orders + 1,
	total_cents = customer_totals.total_cents + EXCLUDED.total_cents`,
		o.ID, o.Customer, o.AmountCents, rec.Topic, rec.Partition, rec.Offset, pid)
	return err
}

// unsafeReplayEnv names the variable that switches the inbox's replay
// protection off — ORDERS_UNSAFE_NO_REPLAY_PROTECTION=true — in a build
// with the tidemark_unsafe tag only (unsafe_replay.go; the chaos suite's
// proof that its duplicate check can fail). Any other build ignores it,
// with a warning (replay_protected.go).
const unsafeReplayEnv = "ORDERS_UNSAFE_NO_REPLAY_PROTECTION"

// pid is this process's id, the applications rows' pid.
var pid = int32(os.Getpid())

func run(cfg config, log *slog.Logger) int {
	ctx := context.Background()
	fail := func(what string, err error) int {
		log.Error(what, "err", err)
		return 1
	}

	metricsHandler, mp, err := newMetrics()
	if err != nil {
		return fail("metrics exporter", err)
	}

	// The probes are served from the start: while PostgreSQL or Kafka
	// cannot be reached, /livez answers 200 and /readyz 503 with what the
	// process waits for, and a signal ends the wait (exit 0); what cannot
	// change by waiting (a bad DSN, a missing topic, a refused
	// migration) exits 1.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ln, err := net.Listen("tcp", cfg.http)
	if err != nil {
		return fail("listen "+cfg.http, err)
	}
	st := &starting{}
	var serving atomic.Pointer[http.Handler]
	startMux := http.NewServeMux()
	startMux.Handle("/", st.handler())
	startMux.Handle("GET /metrics", metricsHandler)
	serving.Store(ptr[http.Handler](startMux))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*serving.Load()).ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("serving probes and metrics; starting", "addr", ln.Addr().String())
	setupCtx, setupDone := context.WithCancel(ctx)
	stopped := make(chan os.Signal, 1)
	go func() {
		select {
		case sig := <-sigs:
			stopped <- sig
			setupDone()
		case <-setupCtx.Done():
		}
	}()
	// abort ends the start: the process exits 0 after a signal, else 1.
	abort := func(what string, err error) int {
		setupDone()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = mp.Shutdown(sctx)
		select {
		case sig := <-stopped:
			log.Info("signal received while starting: exiting", "signal", sig.String(), "waiting_for", what)
			return 0
		default:
		}
		return fail(what, err)
	}

	pool, err := pgxpool.New(ctx, cfg.dsn)
	if err != nil {
		// pgx's parse errors may quote the string, password included.
		return abort("database config", errors.New("-dsn / TIDEMARK_PG_DSN is not a valid connection string"))
	}
	if err := st.await(setupCtx, log, "PostgreSQL: creating the orders tables", func(ctx context.Context) error {
		return createTables(ctx, pool, cfg.strict)
	}); err != nil {
		pool.Close()
		return abort("creating the orders tables", err)
	}
	iopts := append([]inbox.Option{inbox.MeterProvider(mp), inbox.Logger(log)}, cfg.unsafeInbox...)
	if cfg.share {
		iopts = append(iopts, inbox.ShareGroup())
	}
	store, err := inbox.New(pool, cfg.group, iopts...)
	if err != nil {
		pool.Close()
		return abort("inbox", err)
	}
	if err := st.await(setupCtx, log, "PostgreSQL: migrating the inbox", store.Migrate); err != nil {
		pool.Close()
		return abort("inbox migration", err)
	}
	if err := st.await(setupCtx, log, "Kafka: finding the topics", func(ctx context.Context) error { return ensureTopics(ctx, cfg) }); err != nil {
		pool.Close()
		return abort("topics", err)
	}

	src, err := newSource(cfg, log)
	if err != nil {
		pool.Close()
		return abort("kafka source", err)
	}
	effect := apply
	if cfg.strict {
		effect = applyStrict
		log.Info("strict effect: every application is recorded in the applications table (a test effect)")
	}
	handle := store.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if cfg.delay > 0 {
			select {
			case <-time.After(cfg.delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effect(ctx, tx, rec)
	})
	ropts := []runner.Option{
		runner.Handle(cfg.topic, handle),
		runner.Concurrency(cfg.concurrency),
		runner.Failure(runner.DeadLetter(cfg.dlq, 5, nil)),
		runner.Backoff(50*time.Millisecond, 5*time.Second),
		runner.DrainBudget(cfg.budget / 2),
		runner.Logger(log),
		runner.MeterProvider(mp),
	}
	if cfg.maxBuffered > 0 {
		ropts = append(ropts, runner.MaxBufferedBytes(cfg.maxBuffered))
	}
	if !cfg.share {
		// A share group has no assignments and no lease (the runner
		// refuses OnAssign over a share source).
		ropts = append(ropts, runner.OnAssign(store.AssignHook()))
	}
	r, err := runner.New(src, ropts...)
	if err != nil {
		pool.Close()
		return abort("runner", err)
	}

	probes := shutdown.NewProbes(r, 15*time.Second)
	if err := observeReady(mp, cfg.group, probes.Ready); err != nil {
		pool.Close()
		return abort("readiness gauge", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", probes.Handler())
	mux.Handle("GET /metrics", metricsHandler)
	status.New(r, status.Controls(cfg.controls)).Register(mux)

	coord, err := shutdown.NewCoordinator(r, shutdown.Budget(cfg.budget), shutdown.WithProbes(probes), shutdown.Logger(log),
		shutdown.Close(
			shutdown.Closer{Name: "http", Close: srv.Shutdown},
			shutdown.Closer{Name: "database", Close: func(context.Context) error { pool.Close(); return nil }},
			shutdown.Closer{Name: "metrics", Close: mp.Shutdown},
		))
	if err != nil {
		pool.Close()
		return abort("shutdown coordinator", err)
	}
	// Started: the signal now stops the runner (the coordinator); one
	// that came during the last step still does.
	setupDone()
	select {
	case sig := <-stopped:
		sigs <- sig
	default:
	}
	serving.Store(ptr[http.Handler](mux))
	log.Info("started: serving the runner's probes, the status page and metrics", "controls", cfg.controls)

	if cfg.share {
		// Retention: a share group commits no offsets; every record below
		// a share-partition start offset is acknowledged or archived, and
		// never delivered again, so its inbox row can go.
		adm, err := kgo.NewClient(append(clientOpts(cfg), kgo.SeedBrokers(cfg.brokers...))...)
		if err != nil {
			return fail("admin client", err)
		}
		defer adm.Close()
		rctx, stopRetention := context.WithCancel(ctx)
		retained := make(chan struct{})
		go func() {
			defer close(retained)
			_ = store.RunRetention(rctx, time.Minute, ShareStartOffsets(kadm.NewClient(adm), cfg.group))
		}()
		defer func() { stopRetention(); <-retained }()
	}
	probes.Started()
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(context.Background()) }()
	var stopErr error
	select {
	case sig := <-sigs:
		log.Info("signal received: stopping", "signal", sig.String(), "budget", cfg.budget)
		stopErr = awaitRun(log, coord.Stop(sigs), runDone, sigs, forcedGrace)
	case err := <-runDone:
		// The runner stopped by itself (a fatal source error): close the
		// rest and report it.
		if err == nil {
			err = errors.New("runner stopped unexpectedly")
		}
		log.Error("runner stopped", "err", err)
		_ = coord.Stop(nil)
		return 1
	}
	code := shutdown.ExitCode(stopErr)
	log.Info("exiting", "status", code)
	return code
}

// starting is the process's state before the runner exists: what it
// waits for, served by /readyz.
type starting struct {
	mu     sync.Mutex
	reason string
}

func (st *starting) set(reason string) {
	st.mu.Lock()
	st.reason = reason
	st.mu.Unlock()
}

func (st *starting) get() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.reason
}

// handler answers /livez 200 (the process is alive, and waiting: a
// restart would not bring PostgreSQL or Kafka back) and every other path,
// /readyz included, 503 with what the start waits for.
func (st *starting) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if r.URL.Path == "/livez" {
			fmt.Fprintf(w, "ok: starting: %s\n", st.get())
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: starting: %s\n", st.get())
	})
}

// await runs step until it succeeds, while its error says the dependency
// cannot be reached (see waitable), with a backoff from half a second to
// ten; /readyz meanwhile names the step and its last error. Any other
// error, or ctx ending (a signal), ends the wait.
func (st *starting) await(ctx context.Context, log *slog.Logger, step string, f func(context.Context) error) error {
	st.set(step)
	wait := 500 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || !waitable(err) || ctx.Err() != nil {
			return err
		}
		st.set(step + ": " + err.Error())
		log.Warn("waiting to start", "step", step, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// waitable reports whether err says a dependency cannot be reached now:
// PostgreSQL refused or timed out the connection, or the Kafka brokers
// did not answer. Such a start waits; anything else exits.
func waitable(err error) bool {
	var ce *pgconn.ConnectError
	var u unreachable
	return errors.As(err, &ce) || errors.As(err, &u) || pgconn.Timeout(err)
}

// unreachable marks an error of a Kafka request no broker answered.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }
func (u unreachable) Unwrap() error { return u.err }

func ptr[T any](v T) *T { return &v }

// forcedGrace is how long the process waits for Run after a second signal:
// enough for handlers that honour their cancelled ctx and for the client
// to close, and the bound on "at once".
const forcedGrace = time.Second

// awaitRun waits for Run's result (runDone) after the coordinator's Stop
// returned stopErr, and returns the stop's result. Run was stopped or
// closed by then, but returns only once its handlers honour their
// cancelled ctx: after a second signal (during Stop: ErrForced, or during
// this wait) it waits at most grace, and the process exits 4 without it.
func awaitRun(log *slog.Logger, stopErr error, runDone <-chan error, sigs <-chan os.Signal, grace time.Duration) error {
	if !errors.Is(stopErr, shutdown.ErrForced) {
		select {
		case <-runDone:
			return stopErr
		case sig := <-sigs:
			log.Warn("second signal: exiting at once", "signal", sig.String())
			stopErr = errors.Join(stopErr, shutdown.ErrForced)
		}
	}
	select {
	case <-runDone:
	case <-time.After(grace):
		log.Warn("runner still stopping after a second signal: exiting without it", "waited", grace)
	}
	return stopErr
}

// newMetrics is the service's metrics pipeline: an OpenTelemetry meter
// provider whose metrics the returned handler serves in Prometheus' text
// format (GET /metrics). deploy/prometheus and deploy/grafana query the
// names it writes, and TestMetricsServeWhatDeployQueries checks them
// against this function's output.
func newMetrics() (http.Handler, *sdkmetric.MeterProvider, error) {
	reg := promclient.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		// Pinned, not left to the default: underscore escaping with the
		// unit and _total suffixes (tidemark.record.oldest_age ->
		// tidemark_record_oldest_age_seconds), the names deploy/'s rules
		// and dashboard query. The alternative writes UTF-8 names
		// (tidemark.record.oldest_age_seconds) to a scraper that accepts
		// them, as Prometheus 3 does; promtool 2.42 (Debian's, which
		// checks deploy/prometheus) and Prometheus 2 cannot even parse
		// those, and the rules would match nothing. Earlier releases of
		// the exporter chose that alternative by default (when
		// prometheus/common's validation scheme is utf8, its default),
		// and v0.69.0's documentation still says so: an upgrade must not
		// change the names silently.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, nil, err
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), nil
}

// observeReady exports ready — the probes' readiness, what /readyz
// answers — as the gauge tidemark.ready: 1 while this member is ready, 0
// otherwise, with messaging.consumer.group.name. The alert TidemarkNotReady
// (deploy/prometheus) needs it: Prometheus' own up says only that /metrics
// answered, which it does while the member is draining or, once readiness
// follows the group, cut off from the coordinator. The library exports no
// readiness metric, so the service does, from the same function its probe
// serves.
func observeReady(mp metric.MeterProvider, group string, ready func() (bool, string)) error {
	m := mp.Meter("github.com/tidemark/tidemark/examples/orders")
	g, err := m.Int64ObservableGauge("tidemark.ready",
		metric.WithDescription("1 while this member is ready (its /readyz answers 200), else 0."))
	if err != nil {
		return err
	}
	attrs := metric.WithAttributes(semconv.MessagingConsumerGroupName(group))
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if ok, _ := ready(); ok {
			v = 1
		}
		o.ObserveInt64(g, v, attrs)
		return nil
	}, g)
	return err
}

// newSource returns the consumer-group source, or in share mode the
// share-group source, which starts a new group at the earliest offset
// (share.auto.offset.reset defaults to latest) and sets -share-lock.
func newSource(cfg config, log *slog.Logger) (runner.Source, error) {
	if cfg.share {
		sopts := []share.Option{share.Logger(log), share.GroupConfig("share.auto.offset.reset", "earliest"),
			share.ClientOptions(clientOpts(cfg)...)}
		if cfg.shareLock > 0 {
			sopts = append(sopts, share.GroupConfig("share.record.lock.duration.ms", strconv.FormatInt(cfg.shareLock.Milliseconds(), 10)))
		}
		return share.New(cfg.brokers, cfg.group, []string{cfg.topic}, sopts...)
	}
	fopts := []franz.Option{franz.Logger(log), franz.SessionTimeout(cfg.session),
		franz.HeartbeatInterval(min(time.Second, cfg.session/3)), franz.ClientOptions(clientOpts(cfg)...)}
	if cfg.instanceID != "" {
		fopts = append(fopts, franz.InstanceID(cfg.instanceID))
	}
	return franz.New(cfg.brokers, cfg.group, []string{cfg.topic}, fopts...)
}

// ShareStartOffsets is the inbox's retention bound over a share group:
// each partition's share-partition start offset (DescribeShareGroupOffsets).
// Every record below it is acknowledged or archived and is never delivered
// again (unless an operator resets the group's offsets). The broker
// persists the start offset lazily — on Kafka 4.4 it trails the records
// acknowledged — which only keeps rows longer. A partition the group has
// no state for is left out: not pruned.
func ShareStartOffsets(adm *kadm.Client, group string) inbox.CommittedFunc {
	return func(ctx context.Context, tps []runner.TP) (map[runner.TP]int64, error) {
		ds, err := adm.DescribeShareGroupOffsets(ctx, group)
		if err == nil {
			err = ds.Error()
		}
		if err != nil {
			return nil, err
		}
		out := make(map[runner.TP]int64, len(tps))
		for _, tp := range tps {
			if o, ok := ds[group].Offsets.Lookup(tp.Topic, tp.Partition); ok && o.Err == nil && o.StartOffset >= 0 {
				out[tp] = o.StartOffset
			}
		}
		return out, nil
	}
}

// ensureTopics creates the dead-letter topic (same partition count as the
// orders topic) when it is missing, so a malformed order can always be
// parked. The orders topic itself must exist.
func ensureTopics(ctx context.Context, cfg config) error {
	cl, err := kgo.NewClient(append(clientOpts(cfg), kgo.SeedBrokers(cfg.brokers...))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// Each try: the start retries (starting.await) while no broker answers.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx, cfg.topic, cfg.dlq)
	if err != nil {
		return unreachable{fmt.Errorf("listing topics: %w", err)}
	}
	t, ok := td[cfg.topic]
	if !ok || t.Err != nil {
		return fmt.Errorf("topic %q does not exist; create it first (examples/orders/produce -create)", cfg.topic)
	}
	if d, ok := td[cfg.dlq]; ok && d.Err == nil {
		return nil
	}
	resp, err := adm.CreateTopic(ctx, int32(len(t.Partitions)), -1, nil, cfg.dlq)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
		return fmt.Errorf("creating the dead-letter topic %q: %w", cfg.dlq, err)
	}
	return nil
}
