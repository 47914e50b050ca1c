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
