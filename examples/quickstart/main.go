// Command quickstart is what `make demo` runs until tidemark's runner
// exists: a plain consume loop against the test bed, no tidemark code. It
//
//  1. creates a topic (6 partitions by default),
//  2. produces 10,000 keyed records to it with franz-go,
//  3. consumes them through a consumer group, writing one row per record to
//     PostgreSQL in one transaction per poll and committing the offsets to
//     Kafka only after that transaction committed,
//  4. prints a summary: produced, consumed, rows, whether the committed
//     offsets equal the end offsets, and the time each step took.
//
// Rows are keyed by topic/partition/offset and inserted with ON CONFLICT DO
// NOTHING, so a record delivered again after a crash between the database
// commit and the Kafka commit is not written twice. tidemark's inbox does
// this properly, with fencing; this program only shows the order of the two
// commits.
//
// It reads TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN, which
// `scripts/testbed up` writes to .testbed/env. The runner-based orders
// example will replace it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type config struct {
	brokers    []string
	dsn        string
	records    int
	partitions int
	keys       int
	topic      string
	group      string
	timeout    time.Duration
}

func main() {
	var cfg config
	flag.IntVar(&cfg.records, "records", 10_000, "records to produce and consume")
	flag.IntVar(&cfg.partitions, "partitions", 6, "partitions of the topic")
	flag.IntVar(&cfg.keys, "keys", 500, "distinct record keys")
	flag.StringVar(&cfg.topic, "topic", "", "topic to create (default: quickstart-<time>)")
	flag.StringVar(&cfg.group, "group", "", "consumer group (default: the topic's name)")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "bound of the whole run")
	flag.Parse()

	if err := cfg.fill(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func (c *config) fill() error {
	const hint = "start the test bed: scripts/testbed up && source .testbed/env (or run: make demo)"
	env := os.Getenv("TIDEMARK_KAFKA_BROKERS")
	if env == "" {
		return errors.New("TIDEMARK_KAFKA_BROKERS is not set; " + hint)
	}
	c.brokers = strings.Split(env, ",")
	if c.dsn = os.Getenv("TIDEMARK_PG_DSN"); c.dsn == "" {
		return errors.New("TIDEMARK_PG_DSN is not set; " + hint)
	}
	if c.records < 1 || c.partitions < 1 || c.keys < 1 {
		return errors.New("-records, -partitions and -keys must be positive")
	}
	if c.topic == "" {
		c.topic = "quickstart-" + time.Now().Format("20060102-150405.000")
	}
	if c.group == "" {
		c.group = c.topic
	}
	return nil
}

func run(ctx context.Context, cfg config) error {
	start := time.Now()

	// A short MetadataMinAge (default 5s): the admin client waits for the new
	// topic's leaders and must see them as soon as they exist.
	admCl, err := kgo.NewClient(kgo.SeedBrokers(cfg.brokers...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)

	pool, err := pgxpool.New(ctx, cfg.dsn)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_rows (
		topic        text        NOT NULL,
		"partition"  int         NOT NULL,
		"offset"     bigint      NOT NULL,
		key          text        NOT NULL,
		value        text        NOT NULL,
		written_at   timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (topic, "partition", "offset")
	)`); err != nil {
		return fmt.Errorf("postgres: create table: %w", err)
	}

	// 1. The topic.
	created, err := adm.CreateTopic(ctx, int32(cfg.partitions), 1, nil, cfg.topic)
	if err == nil {
		err = created.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", cfg.topic, err)
	}
	if err := waitForLeaders(ctx, adm, cfg.topic, cfg.partitions); err != nil {
		return err
	}

	// 2. Produce.
	t0 := time.Now()
	produced, err := produce(ctx, cfg)
	if err != nil {
		return err
	}
	produceTook := time.Since(t0)

	// 3. Consume through a group, rows first, then offsets.
	t0 = time.Now()
	consumed, err := consume(ctx, cfg, pool)
	if err != nil {
		return err
	}
	consumeTook := time.Since(t0)

	// 4. Check and summarize.
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM quickstart_rows WHERE topic = $1`, cfg.topic).Scan(&rows); err != nil {
		return fmt.Errorf("postgres: count rows: %w", err)
	}
	end, err := adm.ListEndOffsets(ctx, cfg.topic)
	if err == nil {
		err = end.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	committed, err := adm.FetchOffsetsForTopics(ctx, cfg.group, cfg.topic)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("committed offsets: %w", err)
	}
	endBy, committedBy := map[int32]int64{}, map[int32]int64{}
	end.Each(func(o kadm.ListedOffset) { endBy[o.Partition] = o.Offset })
	for p, o := range committed[cfg.topic] {
		committedBy[p] = o.At
	}
	offsetsOK := maps.Equal(endBy, committedBy)

	fmt.Printf("tidemark quickstart: a plain franz-go + pgx consumer (the runner-based orders example will replace it)\n")
	fmt.Printf("  topic       %s (%d partitions), group %s\n", cfg.topic, cfg.partitions, cfg.group)
	fmt.Printf("  produced    %d records, %d keys, in %s\n", produced, cfg.keys, produceTook.Round(time.Millisecond))
	fmt.Printf("  consumed    %d records in %s\n", consumed, consumeTook.Round(time.Millisecond))
	fmt.Printf("  rows        %d in PostgreSQL table quickstart_rows\n", rows)
	fmt.Printf("  committed   %s\n", describeOffsets(committedBy, endBy, offsetsOK))
	fmt.Printf("  total       %s\n", time.Since(start).Round(time.Millisecond))

	if produced != cfg.records || consumed != cfg.records || rows != cfg.records || !offsetsOK {
		return errors.New("summary does not add up: see above")
	}
	return nil
}

// waitForLeaders returns once every partition of a new topic has a leader.
// Producing earlier works too, but the producer would find the topic unknown
// and retry only at its next metadata refresh.
func waitForLeaders(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			td := md.Topics[topic]
			ready := td.Err == nil && len(td.Partitions) == partitions
			for _, p := range td.Partitions {
				ready = ready && p.Err == nil && p.Leader >= 0
			}
			if ready {
				// The metadata can name a leader a moment before that broker
				// serves the partition; a produce then fails with
				// NOT_LEADER_FOR_PARTITION and the client waits for its next
				// metadata refresh (5s by default). ListOffsets is answered
				// by the leader's replica manager, so it waits for that.
				var listed kadm.ListedOffsets
				listed, err = adm.ListEndOffsets(ctx, topic)
				if err == nil {
					err = listed.Error()
				}
				ready = err == nil
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func produce(ctx context.Context, cfg config) (int, error) {
	// A client of its own, created after the topic exists: it learns the
	// topic's leaders with its first metadata request.
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.brokers...),
		kgo.DefaultProduceTopic(cfg.topic),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	errs := make(chan error, 1)
	for i := range cfg.records {
		r := &kgo.Record{
			Key:   []byte("customer-" + strconv.Itoa(i%cfg.keys)),
			Value: []byte(`{"order":` + strconv.Itoa(i) + `}`),
		}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	select {
	case err := <-errs:
		return 0, fmt.Errorf("produce: %w", err)
	default:
	}
	return cfg.records, nil
}

func consume(ctx context.Context, cfg config, pool *pgxpool.Pool) (int, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.brokers...),
		kgo.ConsumerGroup(cfg.group),
		kgo.ConsumeTopics(cfg.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Offsets are committed by hand, after the rows are in PostgreSQL.
		kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		return 0, err
	}
	defer cl.Close() // leaves the group

	consumed := 0
	for consumed < cfg.records {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return consumed, fmt.Errorf("consumed %d of %d records: %w", consumed, cfg.records, err)
		}
		if err := fetches.Err(); err != nil {
			return consumed, fmt.Errorf("poll: %w", err)
		}
		records := fetches.Records()
		if len(records) == 0 {
			continue
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			batch := &pgx.Batch{}
			for _, r := range records {
				batch.Queue(`INSERT INTO quickstart_rows (topic, "partition", "offset", key, value)
					VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
					r.Topic, r.Partition, r.Offset, string(r.Key), string(r.Value))
			}
			return tx.SendBatch(ctx, batch).Close()
		})
		if err != nil {
			return consumed, fmt.Errorf("postgres: write %d rows: %w", len(records), err)
		}
		// Only now, with the rows committed, may Kafka learn that these
		// records are done.
		if err := cl.CommitRecords(ctx, records...); err != nil {
			return consumed, fmt.Errorf("commit offsets: %w", err)
		}
		consumed += len(records)
	}
	return consumed, nil
}

func describeOffsets(committed, end map[int32]int64, ok bool) string {
	var sum int64
	for _, o := range end {
		sum += o
	}
	if ok {
		return fmt.Sprintf("offsets == end offsets on all %d partitions (sum %d)", len(end), sum)
	}
	return fmt.Sprintf("offsets %v != end offsets %v", committed, end)
}
