// Command quickstart is the smallest real tidemark program. It
//
//  1. creates a topic (-partitions, default 6) and produces -records
//     (default 10,000) JSON orders to it, keyed by customer;
//  2. consumes them with a tidemark runner over the franz-go source: one
//     handler for the topic, each customer's orders one at a time and in
//     order, up to -concurrency handlers at once;
//  3. stops once every order was handled — or on SIGINT or SIGTERM — the
//     graceful way: the runner stops fetching, lets the running handlers
//     finish, commits the offsets of what is done and leaves the group;
//  4. prints a summary: produced, handled, handled twice, the committed
//     offsets against the topic's end offsets and, with the inbox, the rows
//     written.
//
// With a PostgreSQL database (-dsn, default $TIDEMARK_PG_DSN) the handler
// applies each order through tidemark's inbox (pkg/inbox): the order's row
// and the inbox's record of it commit in one transaction, so a record
// delivered again applies nothing. Without one it counts in memory.
//
// The brokers are -brokers, default $TIDEMARK_KAFKA_BROKERS; `make
// quickstart` starts the test bed and runs it with both set. Exit status 0
// when every order was handled once and committed, 1 when not (the summary
// says what), 2 for a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// Order is the value of every record.
type Order struct {
	ID       int    `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

type config struct {
	brokers     []string
	dsn         string
	records     int
	partitions  int
	keys        int
	concurrency int
	work        time.Duration
	topic       string
	group       string
	timeout     time.Duration
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	// SIGINT (Ctrl-C) or SIGTERM ends ctx: the runner then stops gracefully.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", os.Getenv("TIDEMARK_KAFKA_BROKERS"), "Kafka brokers, comma-separated (default $TIDEMARK_KAFKA_BROKERS)")
	fs.StringVar(&c.dsn, "dsn", os.Getenv("TIDEMARK_PG_DSN"), "PostgreSQL for the inbox (default $TIDEMARK_PG_DSN; empty: count in memory)")
	fs.IntVar(&c.records, "records", 10_000, "orders to produce and consume")
	fs.IntVar(&c.partitions, "partitions", 6, "partitions of the topic")
	fs.IntVar(&c.keys, "keys", 500, "distinct customers (record keys)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "handlers running at once (runner.Concurrency)")
	fs.DurationVar(&c.work, "work", 0, "time each handler takes on top of its effect, to watch a slow consumer")
	fs.StringVar(&c.topic, "topic", "", "topic to create (default quickstart-<time>)")
	fs.StringVar(&c.group, "group", "", "consumer group (default: the topic's name)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "bound of the whole run")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	const hint = "start the test bed: scripts/testbed up && source .testbed/env (or run: make quickstart)"
	for b := range strings.SplitSeq(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.brokers = append(c.brokers, b)
		}
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case len(c.brokers) == 0:
		return c, errors.New("no brokers: pass -brokers or set TIDEMARK_KAFKA_BROKERS; " + hint)
	case c.records < 1 || c.partitions < 1 || c.keys < 1 || c.concurrency < 1:
		return c, errors.New("-records, -partitions, -keys and -concurrency must be positive")
	case c.work < 0 || c.timeout <= 0:
		return c, errors.New("-work must not be negative, -timeout must be positive")
	}
	if c.topic == "" {
		c.topic = "quickstart-" + time.Now().Format("20060102-150405.000")
	}
	if c.group == "" {
		c.group = c.topic
	}
	return c, nil
}

// tally counts what the handler did, by record.
type tally struct {
	mu      sync.Mutex
	handled map[runner.TP]map[int64]int // topic/partition → offset → times
	n       int                         // distinct records handled
	again   int                         // handled more than once
	done    chan struct{}               // closed when n reaches want
	want    int
}

func (t *tally) add(rec runner.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := runner.TP{Topic: rec.Topic, Partition: rec.Partition}
	if t.handled[tp] == nil {
		t.handled[tp] = map[int64]int{}
	}
	t.handled[tp][rec.Offset]++
	if t.handled[tp][rec.Offset] > 1 {
		t.again++
		return
	}
	if t.n++; t.n == t.want {
		close(t.done)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	start := time.Now()
	adm, closeAdm, err := admin(cfg.brokers)
	if err != nil {
		return err
	}
	defer closeAdm()

	// 1. The topic and its orders.
	if err := createTopic(ctx, adm, cfg.topic, cfg.partitions); err != nil {
		return err
	}
	t0 := time.Now()
	if err := produce(ctx, cfg); err != nil {
		return err
	}
	produceTook := time.Since(t0)

	// 2. The handler: in memory, or through the inbox.
	t := &tally{handled: map[runner.TP]map[int64]int{}, done: make(chan struct{}), want: cfg.records}
	apply := func(ctx context.Context, rec runner.Record, o Order) error {
		if cfg.work > 0 {
			select {
			case <-time.After(cfg.work):
			case <-ctx.Done(): // the partition was lost, or the stop ran out of time
				return ctx.Err()
			}
		}
		return nil
	}
	handler := runner.Typed(runner.JSON[Order](), func(ctx context.Context, rec runner.Record, o Order) error {
		if err := apply(ctx, rec, o); err != nil {
			return err
		}
		t.add(rec)
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var opts []runner.Option
	var pool *pgxpool.Pool
	if cfg.dsn != "" {
		var store *inbox.Store
		if pool, store, err = openInbox(ctx, cfg, quiet); err != nil {
			return err
		}
		defer pool.Close()
		// The effect and the inbox's row commit in one transaction; the
		// record is counted once that transaction committed.
		effect := store.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			var o Order
			if err := json.Unmarshal(rec.Value, &o); err != nil {
				return runner.Permanent(err)
			}
			if err := apply(ctx, rec, o); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO quickstart_orders (topic, id, customer, cents) VALUES ($1, $2, $3, $4)`,
				rec.Topic, o.ID, o.Customer, o.Cents)
			return err
		})
		handler = func(ctx context.Context, rec runner.Record) error {
			if err := effect(ctx, rec); err != nil {
				return err
			}
			t.add(rec)
			return nil
		}
		opts = append(opts, runner.OnAssign(store.AssignHook()))
	}

	// 3. The runner over the franz-go source, until every order was
	// handled or ctx ends (SIGINT, SIGTERM, -timeout).
	src, err := franz.New(cfg.brokers, cfg.group, []string{cfg.topic}, franz.Logger(quiet))
	if err != nil {
		return err
	}
	r, err := runner.New(src, append(opts,
		runner.Handle(cfg.topic, handler),
		runner.Concurrency(cfg.concurrency),
		runner.Logger(quiet),
	)...)
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	go func() {
		select {
		case <-t.done: // every order handled: stop the runner
			stopRun()
		case <-runCtx.Done():
		}
	}()
	fmt.Fprintf(out, "tidemark quickstart: consuming %d orders of %s with group %s\n", cfg.records, cfg.topic, cfg.group)
	t0 = time.Now()
	runErr := r.Run(runCtx) // ends gracefully: stop fetching, drain, commit, leave
	consumeTook := time.Since(t0)

	// 4. The summary.
	t.mu.Lock()
	handled, again := t.n, t.again
	t.mu.Unlock()
	committed, end, err := offsets(context.WithoutCancel(ctx), adm, cfg.group, cfg.topic)
	if err != nil {
		return errors.Join(runErr, err)
	}
	var rows int
	if pool != nil {
		// Not bounded by ctx, which a signal may have ended: a summary
		// after Ctrl-C still counts the rows.
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := pool.QueryRow(qctx, `SELECT count(*) FROM quickstart_orders WHERE topic = $1`, cfg.topic).Scan(&rows)
		cancel()
		if err != nil {
			return errors.Join(runErr, fmt.Errorf("counting the rows: %w", err))
		}
	}
	var lag int64
	for p, e := range end {
		lag += e - committed[p]
	}
	fmt.Fprintf(out, "  topic       %s, %d partitions, %d customers\n", cfg.topic, cfg.partitions, cfg.keys)
	fmt.Fprintf(out, "  produced    %d orders in %s\n", cfg.records, produceTook.Round(time.Millisecond))
	fmt.Fprintf(out, "  handled     %d orders in %s (concurrency %d)\n", handled, consumeTook.Round(time.Millisecond), cfg.concurrency)
	fmt.Fprintf(out, "  twice       %d\n", again)
	if pool != nil {
		fmt.Fprintf(out, "  rows        %d in quickstart_orders (through the inbox)\n", rows)
	}
	fmt.Fprintf(out, "  committed   %d of %d partitions at their end offset, %d records behind\n", atEnd(committed, end), len(end), lag)
	fmt.Fprintf(out, "  total       %s\n", time.Since(start).Round(time.Millisecond))

	switch {
	case runErr != nil:
		return fmt.Errorf("the runner: %w", runErr)
	case handled < cfg.records:
		return fmt.Errorf("stopped (%v) after %d of %d orders; the committed offsets are where the next run of group %s starts",
			context.Cause(ctx), handled, cfg.records, cfg.group)
	case again > 0, lag != 0, pool != nil && rows != cfg.records:
		return errors.New("the summary does not add up: see above")
	}
	fmt.Fprintln(out, "  result      OK: every order handled, and committed")
	return nil
}

func admin(brokers []string) (*kadm.Client, func(), error) {
	// A short MetadataMinAge (default 5s): createTopic waits for the new
	// topic's leaders and must see them as soon as they exist.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// createTopic creates topic and returns once every partition has a leader
// that answers: producing earlier works too, but the producer would find
// the topic unknown and retry only at its next metadata refresh.
func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	created, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = created.Err
	}
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	for {
		// ListOffsets is answered by the partition leader's replica
		// manager, so it waits until the leaders serve the partitions.
		listed, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = listed.Error()
		}
		if err == nil && len(listed[topic]) == partitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func produce(ctx context.Context, cfg config) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.brokers...), kgo.DefaultProduceTopic(cfg.topic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var (
		mu    sync.Mutex
		first error
	)
	for i := range cfg.records {
		o := Order{ID: i, Customer: fmt.Sprintf("customer-%d", i%cfg.keys), Cents: int64(100 + i%900)}
		v, _ := json.Marshal(o) // an Order always marshals
		cl.Produce(ctx, &kgo.Record{Key: []byte(o.Customer), Value: v}, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("producing: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if first != nil {
		return fmt.Errorf("producing: %w", first)
	}
	return nil
}

func openInbox(ctx context.Context, cfg config, log *slog.Logger) (*pgxpool.Pool, *inbox.Store, error) {
	pool, err := pgxpool.New(ctx, cfg.dsn)
	if err != nil {
		return nil, nil, errors.New("-dsn is not a valid connection string") // pgx's error may quote the password
	}
	store, err := inbox.New(pool, cfg.group, inbox.Logger(log))
	if err == nil {
		err = store.Migrate(ctx) // the inbox's own tables
	}
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_orders (
			topic    text   NOT NULL,
			id       int    NOT NULL,
			customer text   NOT NULL,
			cents    bigint NOT NULL,
			PRIMARY KEY (topic, id))`)
	}
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	return pool, store, nil
}

// offsets returns the group's committed offsets and the topic's end
// offsets, by partition.
func offsets(ctx context.Context, adm *kadm.Client, group, topic string) (committed, end map[int32]int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("end offsets: %w", err)
	}
	fetched, err := adm.FetchOffsetsForTopics(ctx, group, topic)
	if err == nil {
		err = fetched.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		fetched, err = nil, nil // stopped before the group existed: nothing committed
	}
	if err != nil {
		return nil, nil, fmt.Errorf("committed offsets: %w", err)
	}
	committed, end = map[int32]int64{}, map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	for p, o := range fetched[topic] {
		if o.At >= 0 {
			committed[p] = o.At
		}
	}
	return committed, end, nil
}

func atEnd(committed, end map[int32]int64) int {
	n := 0
	for p, e := range end {
		if committed[p] == e {
			n++
		}
	}
	return n
}
