//go:build integration

package integration_test

// Smoke tests of the test bed itself: each proves one behaviour of the real
// broker or database that tidemark's tests will rely on, with a plain client
// and no tidemark code in between.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

const (
	smokeRecords    = 10_000
	smokePartitions = 6
	smokeKeys       = 256
	smokeTimeout    = 2 * time.Minute
)

func smokeKey(i int) string { return fmt.Sprintf("key-%03d", i%smokeKeys) }

// smokeRecorder returns a func that keeps what a plain consumer got in l
// and fails the test at once on a record that was not produced so: its
// value is not an index below smokeRecords, that index came before, or its
// key is not the one the index was produced with. Which offsets came, how
// often and in what order, smokeDelivered checks.
func smokeRecorder(t testing.TB, l *kafkatest.Ledger) func(topic string, partition int32, offset int64, key, value []byte) {
	seen := make([]bool, smokeRecords)
	return func(topic string, partition int32, offset int64, key, value []byte) {
		t.Helper()
		i, err := strconv.Atoi(string(value))
		if err != nil || i < 0 || i >= len(seen) {
			t.Fatalf("p%d@%d: value %q is not a produced index", partition, offset, value)
		}
		if seen[i] {
			t.Fatalf("p%d@%d: value %d delivered twice", partition, offset, i)
		}
		seen[i] = true
		if k, want := string(key), smokeKey(i); k != want {
			t.Fatalf("p%d@%d: value %d has key %q, produced with %q", partition, offset, i, k, want)
		}
		l.Add("", runner.Record{Topic: topic, Partition: partition, Offset: offset, Key: key, Value: value})
	}
}

// smokeDelivered checks what l holds of topic: every offset below the end
// delivered once, each partition's offsets in order, and each key on one
// partition in offset (so produce) order.
func smokeDelivered(t *testing.T, l *kafkatest.Ledger, topic string) {
	t.Helper()
	for _, err := range []error{l.ExactlyOnce(topic, bed.EndOffsets(t, topic)), l.PartitionOrder(), l.KeyOrder()} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// assertCommittedAtEnd checks that group committed exactly the end offset of
// every partition of topic, and that those add up to n records.
func assertCommittedAtEnd(t *testing.T, group, topic string, n int) {
	t.Helper()
	end := bed.EndOffsets(t, topic)
	committed := bed.Committed(t, group, topic)
	if !maps.Equal(committed, end) {
		t.Fatalf("committed offsets %v, end offsets %v", committed, end)
	}
	var total int64
	for _, o := range end {
		total += o
	}
	if total != int64(n) || len(end) != smokePartitions {
		t.Fatalf("end offsets %v add up to %d over %d partitions, want %d over %d", end, total, len(end), n, smokePartitions)
	}
}

// TestFranzGroupRoundTrip produces 10,000 keyed records, consumes them back
// through a consumer group with franz-go committing by hand after each poll,
// and reads the committed offsets back from the broker.
func TestFranzGroupRoundTrip(t *testing.T) {
	t.Parallel()
	topic := bed.Topic(t, smokePartitions)
	bed.Produce(t, topic, smokeRecords, smokeKey)

	group := bed.Group(t)
	cl := bed.Client(t,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	ctx := timeout(t, smokeTimeout)
	l := kafkatest.NewLedger()
	add := smokeRecorder(t, l)
	for l.Count() < smokeRecords {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the deadline", l.Count(), smokeRecords)
		}
		if err := fetches.Err(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		fetches.EachRecord(func(r *kgo.Record) { add(r.Topic, r.Partition, r.Offset, r.Key, r.Value) })
		if err := cl.CommitRecords(ctx, fetches.Records()...); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}

	members := bed.Members(t, group)
	if len(members) != 1 {
		t.Fatalf("group %s has %d members, want 1: %+v", group, len(members), members)
	}
	if got, want := members[0].Assigned[topic], []int32{0, 1, 2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("the only member is assigned %v of %s, want %v", got, topic, want)
	}
	smokeDelivered(t, l, topic)
	assertCommittedAtEnd(t, group, topic, smokeRecords)

	cl.Close() // leaves the group
	if members := bed.Members(t, group); len(members) != 0 {
		t.Fatalf("group %s still has members after Close: %+v", group, members)
	}
}

// TestKafkaGoGroupRoundTrip is the same round trip with segmentio/kafka-go's
// Reader in a consumer group, committing explicitly in batches.
func TestKafkaGoGroupRoundTrip(t *testing.T) {
	t.Parallel()
	topic := bed.Topic(t, smokePartitions)
	bed.Produce(t, topic, smokeRecords, smokeKey)

	group := bed.Group(t)
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           bed.Kafka(t),
		GroupID:           group,
		Topic:             topic,
		StartOffset:       kafkago.FirstOffset,
		MaxWait:           200 * time.Millisecond,
		HeartbeatInterval: time.Second,
		SessionTimeout:    10 * time.Second,
		// CommitInterval 0: CommitMessages commits synchronously.
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) { t.Logf("kafka-go: "+format, args...) }),
	})
	closed := false
	t.Cleanup(func() {
		if !closed {
			r.Close()
		}
	})

	ctx := timeout(t, smokeTimeout)
	l := kafkatest.NewLedger()
	add := smokeRecorder(t, l)
	var batch []kafkago.Message
	for l.Count() < smokeRecords {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("fetch after %d of %d records: %v", l.Count(), smokeRecords, err)
		}
		add(m.Topic, int32(m.Partition), m.Offset, m.Key, m.Value)
		batch = append(batch, m)
		if len(batch) == 500 || l.Count() == smokeRecords {
			if err := r.CommitMessages(ctx, batch...); err != nil {
				t.Fatalf("commit: %v", err)
			}
			batch = batch[:0]
		}
	}
	smokeDelivered(t, l, topic)
	assertCommittedAtEnd(t, group, topic, smokeRecords)

	closed = true
	if err := r.Close(); err != nil {
		t.Fatalf("close reader: %v", err)
	}
	if members := bed.Members(t, group); len(members) != 0 {
		t.Fatalf("group %s still has members after Close: %+v", group, members)
	}
}

// TestTransactionAbortInvisibleToReadCommitted writes three transactions to
// one partition: committed, aborted, committed. A read_committed consumer
// must see the two committed ones only, in order, and a read_uncommitted
// consumer all three. The offsets show the gaps that aborted records and
// transaction markers leave: offsets delivered to a consumer are sparse.
func TestTransactionAbortInvisibleToReadCommitted(t *testing.T) {
	t.Parallel()
	const per = 50
	topic := bed.Topic(t, 1)
	ctx := timeout(t, smokeTimeout)

	producer := bed.Client(t,
		kgo.TransactionalID(bed.Name(t, "txn")),
		kgo.DefaultProduceTopic(topic),
		kgo.TransactionTimeout(30*time.Second),
	)
	txn := func(prefix string, commit bool) {
		t.Helper()
		if err := producer.BeginTransaction(); err != nil {
			t.Fatalf("begin %s: %v", prefix, err)
		}
		for i := range per {
			r := &kgo.Record{Key: []byte("k"), Value: fmt.Appendf(nil, "%s-%d", prefix, i)}
			if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce %s-%d: %v", prefix, i, err)
			}
		}
		if err := producer.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end %s (commit=%v): %v", prefix, commit, err)
		}
	}
	txn("first", true)
	txn("aborted", false)
	txn("second", true)

	type got struct {
		offset int64
		value  string
	}
	consume := func(isolation kgo.IsolationLevel, want int) []got {
		t.Helper()
		cl := bed.Client(t,
			kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(isolation),
			kgo.FetchMaxWait(200*time.Millisecond),
		)
		defer cl.Close()
		var out []got
		for len(out) < want {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("consumed %d of %d records before the deadline: %v", len(out), want, out)
			}
			if err := fetches.Err(); err != nil {
				t.Fatalf("poll: %v", err)
			}
			fetches.EachRecord(func(r *kgo.Record) { out = append(out, got{r.Offset, string(r.Value)}) })
		}
		return out
	}

	var want []got
	for i := range per {
		want = append(want, got{int64(i), fmt.Sprintf("first-%d", i)})
	}
	for i := range per {
		// after 50 committed, 1 marker, 50 aborted, 1 marker
		want = append(want, got{int64(2*per + 2 + i), fmt.Sprintf("second-%d", i)})
	}
	if committed := consume(kgo.ReadCommitted(), 2*per); !slices.Equal(committed, want) {
		t.Fatalf("read_committed consumer got\n%v\nwant\n%v", committed, want)
	}

	// Three transactions of 50 records, each closed by one marker. Checked
	// only now: EndTransaction returns once the coordinator has decided, and
	// the markers are written after that. A read_committed consumer that saw
	// the last transaction proves its marker is in the log.
	if end := bed.EndOffsets(t, topic); end[0] != 3*per+3 {
		t.Fatalf("end offset %d, want %d (150 records + 3 markers)", end[0], 3*per+3)
	}

	// The aborted records are in the log: read_uncommitted sees them.
	uncommitted := consume(kgo.ReadUncommitted(), 3*per)
	if len(uncommitted) != 3*per {
		t.Fatalf("read_uncommitted consumer got %d records, want %d", len(uncommitted), 3*per)
	}
	if g := uncommitted[per]; g != (got{per + 1, "aborted-0"}) {
		t.Fatalf("read_uncommitted record %d is %v, want aborted-0 at offset %d", per, g, per+1)
	}
}

// TestPostgresRoundTrip writes and reads rows in the test's own schema, and
// checks the transaction behaviour the inbox relies on: a rolled-back insert
// leaves nothing, and a duplicate primary key is a unique violation (23505).
func TestPostgresRoundTrip(t *testing.T) {
	t.Parallel()
	pool := bed.PG(t)
	ctx := timeout(t, smokeTimeout)
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]

	var current string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&current); err != nil {
		t.Fatalf("current_schema: %v", err)
	}
	if current != schema {
		t.Fatalf("current_schema() = %q, want the test's schema %q", current, schema)
	}

	if _, err := pool.Exec(ctx, `CREATE TABLE rows (id bigint PRIMARY KEY, payload text NOT NULL)`); err != nil {
		t.Fatalf("create table: %v", err)
	}
	const n = 1000
	copied, err := pool.CopyFrom(ctx, pgx.Identifier{"rows"}, []string{"id", "payload"},
		pgx.CopyFromSlice(n, func(i int) ([]any, error) { return []any{int64(i), fmt.Sprintf("row-%d", i)}, nil }))
	if err != nil || copied != n {
		t.Fatalf("copy %d rows: copied %d: %v", n, copied, err)
	}

	// Rolled back: not visible.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO rows VALUES (-1, 'rolled back')`); err != nil {
		t.Fatalf("insert: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}

	// Duplicate key: unique violation, and the transaction is aborted.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO rows VALUES (7, 'again')`)
		return err
	})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "23505" {
		t.Fatalf("duplicate insert: got %v, want a unique violation (23505)", err)
	}

	var count, sum int64
	if err := pool.QueryRow(ctx, `SELECT count(*), sum(id) FROM rows`).Scan(&count, &sum); err != nil {
		t.Fatalf("select: %v", err)
	}
	if count != n || sum != n*(n-1)/2 {
		t.Fatalf("rows: count %d sum %d, want %d and %d", count, sum, n, n*(n-1)/2)
	}
	var payload string
	if err := pool.QueryRow(ctx, `SELECT payload FROM rows WHERE id = $1`, 7).Scan(&payload); err != nil || payload != "row-7" {
		t.Fatalf("row 7: %q, %v; want row-7", payload, err)
	}

	var inSchema int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'rows'`, schema).Scan(&inSchema); err != nil || inSchema != 1 {
		t.Fatalf("table rows in schema %s: %d, %v", schema, inSchema, err)
	}
}
