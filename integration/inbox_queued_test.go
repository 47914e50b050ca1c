//go:build integration

package integration_test

// The second effect shape: a QueuedEffect queues its statements and the
// inbox pipelines them, a batch's records behind savepoints in one round
// trip.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxQueuedEffect is inboxEffect as a QueuedEffect: the same row. A
// record whose value is "bad" also queues a statement PostgreSQL refuses;
// "refused" gets a callback that fails it; "panic" panics while queueing.
func inboxQueuedEffect(owner string) inbox.QueuedEffect {
	return func(rec runner.Record, b *pgx.Batch) error {
		b.Queue(`INSERT INTO effects (topic, partition, "offset", key, value, owner) VALUES ($1, $2, $3, $4, $5, $6)`,
			rec.Topic, rec.Partition, rec.Offset, string(rec.Key), string(rec.Value), owner)
		switch string(rec.Value) {
		case "bad":
			b.Queue("SELECT 1/0")
		case "refused":
			b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { return errors.New("refused by the callback") })
		case "panic":
			panic("queueing went wrong")
		}
		return nil
	}
}

// inboxApplyAll runs h for recs at once and returns each one's result.
func inboxApplyAll(h runner.Handler, recs []runner.Record) []error {
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		wg.Go(func() { errs[i] = h(context.Background(), r) })
	}
	wg.Wait()
	return errs
}

// TestInboxQueued: one record per transaction and Batch(16). Every record
// applied once; a record whose statement PostgreSQL refuses, whose
// callback fails, or whose QueuedEffect panics fails alone (rolled back to
// its savepoint, its inbox row gone) while the records of its batch after
// it are sent again and commit; a replay queues nothing; a lease bump
// fences the whole batch.
func TestInboxQueued(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 16} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			tp := runner.TP{Topic: "t", Partition: 0}
			s := inboxStore(t, pool, "g", inbox.Batch(batch), inbox.BatchWait(0))
			inboxTake(t, s, tp, -1)
			var calls sync.Map
			h := s.QueuedHandler(func(rec runner.Record, b *pgx.Batch) error {
				n, _ := calls.LoadOrStore(rec.Offset, new(int))
				*n.(*int)++
				return inboxQueuedEffect("q")(rec, b)
			})
			var recs []runner.Record
			for off := range int64(40) {
				r := inboxRec("t", 0, off)
				switch off {
				case 5:
					r.Value = []byte("bad")
				case 17:
					r.Value = []byte("refused")
				case 23:
					r.Value = []byte("panic")
				}
				recs = append(recs, r)
			}
			errs := inboxApplyAll(h, recs)
			for i, err := range errs {
				if failing := i == 5 || i == 17 || i == 23; failing != (err != nil) {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 37 {
				t.Fatalf("%d effects, want 37", n)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" IN (5, 17, 23)`); n != 0 {
				t.Fatalf("%d inbox rows of the failed records", n)
			}
			// Replays queue nothing; a fixed record applies once.
			calls = sync.Map{}
			fixed := inboxRec("t", 0, 5)
			for i, err := range inboxApplyAll(h, append(recs[:5:5], fixed)) {
				if err != nil {
					t.Fatalf("replay %d: %v", i, err)
				}
			}
			n := 0
			calls.Range(func(k, v any) bool { n++; return true })
			if n != 1 {
				t.Fatalf("the QueuedEffect ran for %d records, want 1 (the fixed one; the others are replays)", n)
			}
			if got := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = 5`); got != 1 {
				t.Fatalf("%d effects of the fixed record", got)
			}
			// A bump fences.
			inboxTake(t, inboxStore(t, pool, "g"), tp, -1)
			if err := h(ctx, inboxRec("t", 0, 100)); !errors.Is(err, runner.ErrFenced) {
				t.Fatalf("after the bump: %v, want ErrFenced", err)
			}
		})
	}
}

// TestInboxQueuedRoundTrips: a QueuedEffect's record costs two round trips
// one per transaction; a full Batch(16) costs two for all 16 records — the
// claim, then every record's statements with the COMMIT — and three when a
// statement has a callback (the COMMIT waits for the callbacks). Counted
// with a pgx tracer, on a connection that has prepared the statements.
func TestInboxQueuedRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		batch    int
		callback bool
		records  int
		want     int64
	}{
		{"one per transaction", 1, false, 1, 2},
		{"batch of 16", 16, false, 16, 2},
		{"batch of 16 with callbacks", 16, true, 16, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, s, tr := inboxTracedStore(t, tc.batch)
			h := s.QueuedHandler(func(rec runner.Record, b *pgx.Batch) error {
				q := b.Queue(`INSERT INTO effects (topic, partition, "offset", owner) VALUES ($1, $2, $3, 'q')`, rec.Topic, rec.Partition, rec.Offset)
				if tc.callback {
					q.Exec(func(ct pgconn.CommandTag) error {
						if ct.RowsAffected() != 1 {
							return fmt.Errorf("%d rows", ct.RowsAffected())
						}
						return nil
					})
				}
				return nil
			})
			run := func(from int64) {
				t.Helper()
				for i, err := range inboxApplyFrom(h, from, tc.records) {
					if err != nil {
						t.Fatalf("record %d: %v", i, err)
					}
				}
			}
			run(0) // prepares the statements on the connection
			tr.Reset()
			run(1000)
			inboxWantRoundTrips(t, tr, tc.records, tc.want)
			if n := inboxCount(t, base, "SELECT count(*) FROM effects"); n != int64(2*tc.records) {
				t.Fatalf("%d effects, want %d", n, 2*tc.records)
			}
		})
	}
}
