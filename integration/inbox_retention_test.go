//go:build integration

package integration_test

// Retention and what it must not forget: the partition's applied
// low-water mark outlives the rows it pruned, so a group whose committed
// offsets are gone (deleted, or expired after offsets.retention.minutes)
// and that starts again from the earliest offset applies nothing twice; and
// a retention round's cost is bounded by an index, not by the rows the
// dedup window keeps.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// inboxDeleteGroup deletes the (empty) group and with it its committed
// offsets, as the broker does offsets.retention.minutes after a group
// emptied.
func inboxDeleteGroup(t *testing.T, group string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := bed.Admin(t).DeleteGroup(ctx, group)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			return
		}
		// The group may still be finishing the last member's leave.
		if ctx.Err() != nil {
			t.Fatalf("deleting group %s: %v", group, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestInboxRetentionRemembersWhatItPruned: a group applies every record,
// retention prunes every row below the committed offsets, the group's
// offsets are deleted, and a member of the group starts again from the
// earliest offset (both adapters): no effect is applied twice, and the
// records below the mark are skipped as replays.
func TestInboxRetentionRemembersWhatItPruned(t *testing.T) {
	t.Parallel()
	for _, adapter := range []string{"franz", "kafkago"} {
		t.Run(adapter, func(t *testing.T) {
			const n, partitions = 400, 2
			pool := inboxDB(t)
			topic := bed.Topic(t, partitions)
			group := bed.Group(t)
			bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%20) })
			run := func(name string) *inbox.Store {
				t.Helper()
				s := inboxStore(t, pool, group, inbox.RetainRecords(0))
				var src runner.Source
				var err error
				if adapter == "franz" {
					src, err = franz.New(bed.Kafka(t), group, []string{topic}, franz.Logger(kafkatest.Logger(t)))
				} else {
					src, err = kafkago.New(bed.Kafka(t), group, []string{topic}, kafkago.Logger(kafkatest.Logger(t)))
				}
				if err != nil {
					t.Fatal(err)
				}
				r, err := runner.New(src, runner.Handle(topic, s.Handler(inboxEffect(name))), runner.OnAssign(s.AssignHook()),
					runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(50*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(context.Background()) }()
				waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := r.Shutdown(ctx); err != nil {
					t.Fatalf("%s: Shutdown: %v", name, err)
				}
				if err := <-done; err != nil {
					t.Fatalf("%s: Run: %v", name, err)
				}
				return s
			}
			first := run("first")
			var pruned int64
			for p, off := range bed.Committed(t, group, topic) {
				k, err := first.Prune(context.Background(), runner.TP{Topic: topic, Partition: p}, off)
				if err != nil {
					t.Fatal(err)
				}
				pruned += k
			}
			if pruned != n {
				t.Fatalf("pruned %d rows, want all %d", pruned, n)
			}
			inboxDeleteGroup(t, group)
			for p, off := range bed.Committed(t, group, topic) {
				if off >= 0 {
					t.Fatalf("the deleted group still has committed offset %d on partition %d", off, p)
				}
			}
			second := run("second")
			if n := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE owner = 'second'`); n != 0 {
				t.Fatalf("%d effects applied again after retention pruned their rows and the group's offsets were deleted", n)
			}
			if st := second.Stats(); st.Applied != 0 {
				t.Fatalf("the second member applied %d records, want 0", st.Applied)
			}
		})
	}
}

// TestInboxPruneRacesAReplay: a replay of a record whose row retention is
// deleting at that moment. The claim waits on the row, finds it gone once
// the prune commits, and inserts it again; the fence at commit (or, under
// REPEATABLE READ, the serialization failure that the prune's update of
// the lease causes) sees the mark the prune raised in the same
// transaction, and the record is a replay: its effect is not committed
// twice.
func TestInboxPruneRacesAReplay(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.TxOptions(pgx.TxOptions{IsoLevel: iso}))
			tp := runner.TP{Topic: "t", Partition: 0}
			inboxTake(t, s, tp, -1)
			h := s.Handler(inboxEffect("a"))
			if err := h(ctx, inboxRec("t", 0, 5)); err != nil {
				t.Fatal(err)
			}
			// What a prune transaction does: delete the row, raise the mark.
			prune, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer prune.Rollback(ctx) //nolint:errcheck
			if _, err := prune.Exec(ctx, `DELETE FROM tidemark_inbox WHERE "offset" = 5`); err != nil {
				t.Fatal(err)
			}
			if _, err := prune.Exec(ctx, `UPDATE tidemark_lease SET applied_below = 6`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- h(ctx, inboxRec("t", 0, 5)) }()
			inboxWaitFor(t, "the replay's claim waiting on the row being deleted", func() bool {
				return inboxLockWaiters(t, pool, "transactionid") >= 1
			})
			if err := prune.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("the replay racing the prune: %v", err)
			}
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
		})
	}
}

// inboxStatements is a pgx tracer that keeps the statements a pool sends
// that start with one of prefixes, with their arguments.
type inboxStatements struct {
	prefixes []string
	mu       sync.Mutex
	got      []pgx.TraceQueryStartData
}

func (s *inboxStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for _, p := range s.prefixes {
		if strings.HasPrefix(strings.TrimSpace(d.SQL), p) {
			s.mu.Lock()
			s.got = append(s.got, d)
			s.mu.Unlock()
		}
	}
	return ctx
}

func (s *inboxStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *inboxStatements) take() []pgx.TraceQueryStartData {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.got
	s.got = nil
	return got
}

// inboxRowsRead runs EXPLAIN ANALYZE of a statement in a transaction it
// rolls back, and returns the rows its scans read (returned plus removed
// by a filter).
func inboxRowsRead(t *testing.T, pool *pgxpool.Pool, d pgx.TraceQueryStartData) float64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var plan []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+d.SQL, d.Args...).Scan(&plan); err != nil {
		t.Fatalf("EXPLAIN of %s: %v", d.SQL, err)
	}
	var read float64
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if strings.HasSuffix(fmt.Sprint(n["Node Type"]), "Scan") {
			rows, _ := n["Actual Rows"].(float64)
			loops, _ := n["Actual Loops"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			read += (rows + removed) * max(loops, 1)
		}
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	return read
}

// TestInboxPruneRoundIsBoundedByAnIndex: 100,000 rows whose dedup keys
// are younger than the dedup window sit below the prune bound. The round
// that meets them deletes the rows without keys and moves the mark past
// them; every later round that has nothing to delete reads a bounded
// number of rows, not the 100,000 it keeps.
func TestInboxPruneRoundIsBoundedByAnIndex(t *testing.T) {
	t.Parallel()
	const kept = 100_000
	ctx := context.Background()
	base := inboxDB(t)
	trace := &inboxStatements{prefixes: []string{"WITH", "DELETE", "UPDATE"}}
	cfg := base.Config().Copy()
	cfg.ConnConfig.Tracer = trace
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := inboxStore(t, pool, "g", inbox.RetainRecords(0), inbox.DedupHeader("message-id"))
	tp := runner.TP{Topic: "t", Partition: 0}
	inboxTake(t, s, tp, -1)
	if _, err := pool.Exec(ctx, `INSERT INTO tidemark_inbox (group_id, topic, partition, "offset", epoch, dedup_key, dedup_hash)
		SELECT 'g', 't', 0, o, 1, md5(o::text), sha256(o::text::bytea) FROM generate_series(0, $1 - 1) o`, kept); err != nil {
		t.Fatal(err)
	}
	h := s.Handler(inboxEffect("a"))
	for off := int64(kept); off < kept+100; off++ { // and some without keys above them
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE tidemark_inbox"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Prune(ctx, tp, kept+100); err != nil || n != 100 {
		t.Fatalf("first Prune: %d, %v; want the 100 rows without a key", n, err)
	}
	trace.take()
	if n, err := s.Prune(ctx, tp, kept+100); err != nil || n != 0 {
		t.Fatalf("second Prune: %d, %v; want nothing", n, err)
	}
	stmts := trace.take()
	if len(stmts) == 0 {
		t.Fatal("the tracer saw no statement of the second Prune")
	}
	for _, d := range stmts {
		if read := inboxRowsRead(t, base, d); read > 1000 {
			t.Errorf("a Prune that deletes nothing read %.0f rows (%d kept with young keys) in\n%s", read, kept, d.SQL)
		}
	}
	if n := inboxCount(t, base, "SELECT count(*) FROM tidemark_inbox"); n != kept {
		t.Fatalf("%d rows left, want the %d with young keys", n, kept)
	}
}
