//go:build integration

package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// shareStart returns group's share-partition start offset and lag on
// topic/0 (-1, -1 when the group has no state for it yet).
func shareStart(t *testing.T, group, topic string) (start, lag int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := bed.Admin(t).DescribeShareGroupOffsets(ctx, group)
	if err == nil {
		err = ds.Error()
	}
	if err != nil {
		t.Fatalf("DescribeShareGroupOffsets: %v", err)
	}
	o, ok := ds[group].Offsets.Lookup(topic, 0)
	if !ok || o.Err != nil {
		return -1, -1
	}
	return o.StartOffset, o.Lag
}

// TestInboxShareRetentionBound: the retention bound over a share group is
// the share-partition start offset. While one record (offset held) is still
// running, the start offset never passes it, whatever is accepted after it;
// pruning below the start offset keeps every row at or above it and raises
// the applied mark to it. It also records how the start offset moves on
// Kafka 4.4 (logged): it trails the acknowledged records.
func TestInboxShareRetentionBound(t *testing.T) {
	t.Parallel()
	const n, held = 60, 20
	pool := inboxDB(t)
	topic, group := bed.Topic(t, 1), bed.Name(t, "share")
	bed.Produce(t, topic, n, nil)
	s := inboxStore(t, pool, group, inbox.ShareGroup(), inbox.RetainRecords(0))
	release := make(chan struct{})
	m := startShare(t, newShareSource(t, group, topic),
		runner.Handle(topic, s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			if rec.Offset == held {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return inboxEffect("a")(ctx, tx, rec)
		})), runner.Failure(runner.Skip(1)), runner.Concurrency(8))
	_ = m
	rows := func() int64 { return inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox") }
	kafkatest.WaitFor(t, time.Minute, "every record but the held one applied", func() bool { return rows() == n-1 })
	// Two lock durations: the held record's lock is renewed meanwhile,
	// and the others' acks have all reached the broker.
	deadline := time.Now().Add(2 * shareLock)
	var start, lag int64
	for time.Now().Before(deadline) {
		if start, lag = shareStart(t, group, topic); start > held {
			t.Fatalf("share-partition start offset %d passed the record still running at %d (lag %d): pruning below it would drop rows a redelivery could need", start, held, lag)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("held record %d running: start offset %d, lag %d", held, start, lag)
	close(release)
	kafkatest.WaitFor(t, time.Minute, "every record applied and acknowledged", func() bool {
		_, lag = shareStart(t, group, topic)
		return rows() == n && lag == 0
	})
	start, lag = shareStart(t, group, topic)
	t.Logf("all %d accepted: start offset %d, lag %d", n, start, lag)
	if start < 0 || start > n {
		t.Fatalf("start offset %d outside 0..%d", start, n)
	}
	tp := runner.TP{Topic: topic, Partition: 0}
	pruned, err := s.Prune(context.Background(), tp, start)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if pruned != start || rows() != n-start ||
		inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" < $1`, start) != 0 {
		t.Fatalf("Prune below start offset %d: pruned %d, %d rows left, want %d pruned and the %d rows at or above it", start, pruned, rows(), start, n-start)
	}
	if mark := inboxCount(t, pool, `SELECT applied_below FROM tidemark_lease WHERE group_id = $1`, group); mark != start {
		t.Fatalf("applied mark %d after pruning below %d", mark, start)
	}
}

// TestInboxShareLease: a ShareGroup Store creates one lease row per
// partition for the whole group, concurrently from many members without
// error, never bumps it, and applies a record once whichever member runs
// it. An epoch changed by hand while an effect runs fences that
// transaction; the Store reads the new epoch and applies the record once.
func TestInboxShareLease(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	const members = 8
	stores := make([]*inbox.Store, members)
	hs := make([]runner.Handler, members)
	for i := range stores {
		stores[i] = inboxStore(t, pool, "sg", inbox.ShareGroup())
		hs[i] = stores[i].Handler(inboxEffect("m"))
	}
	rec := func(off int64) runner.Record { r := inboxRec("t", 0, off); r.DeliveryCount = 1; return r }
	errs := make(chan error, members)
	for i := range hs {
		go func() { errs <- hs[i](ctx, rec(0)) }() // every member gets offset 0 at once
	}
	for range members {
		if err := <-errs; err != nil {
			t.Fatalf("a member's first record: %v", err)
		}
	}
	if got := inboxCount(t, pool, `SELECT count(*) FROM tidemark_lease WHERE group_id = 'sg'`); got != 1 {
		t.Fatalf("%d lease rows for one partition, want 1", got)
	}
	if got := inboxCount(t, pool, `SELECT count(*) FROM effects`); got != 1 {
		t.Fatalf("offset 0 delivered to %d members at once: %d effects, want 1", members, got)
	}
	var replays int64
	for _, s := range stores {
		replays += s.Stats().Replays
	}
	if replays != members-1 {
		t.Fatalf("%d replays counted, want %d", replays, members-1)
	}

	// A reset by hand while an effect runs.
	inEffect, bumped := make(chan struct{}), make(chan struct{})
	var calls int
	s := stores[0]
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, r runner.Record) error {
		calls++
		if calls == 1 {
			close(inEffect)
			<-bumped
		}
		return inboxEffect("m")(ctx, tx, r)
	})
	done := make(chan error, 1)
	go func() { done <- h(ctx, rec(1)) }()
	<-inEffect
	if _, err := pool.Exec(ctx, `UPDATE tidemark_lease SET epoch = epoch + 1 WHERE group_id = 'sg'`); err != nil {
		t.Fatal(err)
	}
	close(bumped)
	if err := <-done; err != nil {
		t.Fatalf("record 1 after a lease reset: %v, want it applied at the new epoch", err)
	}
	if calls != 2 || s.Stats().Fenced != 1 {
		t.Fatalf("%d effect calls, %d fenced; want the fenced attempt and one more", calls, s.Stats().Fenced)
	}
	if got := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = 1`); got != 1 {
		t.Fatalf("record 1: %d effects, want 1", got)
	}
	if got := inboxCount(t, pool, `SELECT epoch FROM tidemark_lease WHERE group_id = 'sg'`); got != 2 {
		t.Fatalf("lease epoch %d, want 2 (1, reset once by hand, never bumped by the Store)", got)
	}
}
