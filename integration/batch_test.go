//go:build integration

package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// TestFranzHandleBatch: a runner with HandleBatch over the franz source
// consumes 20,000 keyed records from six partitions, produced before it
// starts: every record is handled exactly once, every batch holds at most
// BatchSize records of one partition, no key is in two batches at once,
// each key's records come in offset order, batches average well above one
// record, and the group commits the end offsets.
func TestFranzHandleBatch(t *testing.T) {
	t.Parallel()
	const n, size = 20_000, 50
	topic, group := bed.Topic(t, 6), bed.Group(t)
	offs := bed.Cluster(t)
	bed.Produce(t, topic, n, franzKey)
	l := kafkatest.NewLedger()
	record := l.Handler("", nil)

	var mu sync.Mutex
	inFlight := map[string]bool{} // keys of the batches running
	var batches, records int
	var violations []string
	h := func(ctx context.Context, recs []runner.Record) error {
		mu.Lock()
		batches++
		records += len(recs)
		if len(recs) == 0 || len(recs) > size {
			violations = append(violations, fmt.Sprintf("a batch of %d records", len(recs)))
		}
		keys := map[string]bool{}
		for _, rec := range recs {
			if rec.TP() != recs[0].TP() {
				violations = append(violations, fmt.Sprintf("a batch of %s holds %s", recs[0].TP(), rec.String()))
			}
			k := string(rec.Key)
			if inFlight[k] && !keys[k] {
				violations = append(violations, fmt.Sprintf("key %s in two batches at once (%s)", k, rec.String()))
			}
			keys[k] = true
		}
		for k := range keys {
			inFlight[k] = true
		}
		mu.Unlock()
		for _, rec := range recs {
			if err := record(ctx, rec); err != nil {
				return err
			}
		}
		time.Sleep(time.Millisecond) // a round trip: records pile up behind busy keys
		mu.Lock()
		for k := range keys {
			delete(inFlight, k)
		}
		mu.Unlock()
		return nil
	}
	src, err := franz.New(bed.Kafka(t), group, []string{topic},
		franz.Logger(kafkatest.Logger(t)), franz.SessionTimeout(6*time.Second), franz.HeartbeatInterval(time.Second),
		franz.RebalanceTimeout(20*time.Second))
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	m := kafkatest.Start(t, "", src, 30*time.Second,
		runner.HandleBatch(topic, h, runner.BatchSize(size), runner.BatchWait(5*time.Millisecond)),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(100*time.Millisecond), runner.DrainBudget(5*time.Second),
		runner.Concurrency(8))
	kafkatest.WaitFor(t, 2*time.Minute, "every record handled", func() bool { return l.Count() >= n })
	kafkatest.WaitFor(t, 30*time.Second, "committed == end offsets", offs.AtEnd(group, topic))
	m.Stop(t)

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations[:min(len(violations), 10)] {
		t.Error(v)
	}
	ends := bed.EndOffsets(t, topic)
	if err := l.ExactlyOnce(topic, ends); err != nil {
		t.Error(err)
	}
	if got := l.Count(); got != n {
		t.Errorf("%d records handled, want exactly %d", got, n)
	}
	if err := l.KeyOrder(); err != nil {
		t.Error(err)
	}
	mean := float64(records) / float64(batches)
	t.Logf("%d batches, mean %.1f records", batches, mean)
	if mean < 5 {
		t.Errorf("%d batches for %d records: a mean of %.1f, want batches well above one record with a backlog", batches, records, mean)
	}
}

// TestInboxHandleBatchHandover: the runner's HandleBatch over the inbox's
// BatchHandler, one transaction per batch, on the real broker and
// database: two members share the group, the first leaves half-way (its
// partitions move to the second, which replays what the first applied
// but had not committed to Kafka), and every record has exactly one
// effect and one inbox row, each key's effects in offset order, with
// batches well above one record.
func TestInboxHandleBatchHandover(t *testing.T) {
	t.Parallel()
	const n, partitions, keys, size = 10_000, 4, 200, 32
	pool := inboxDB(t)
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })
	var mu sync.Mutex
	var batches, records int
	member := func(name string) *kafkatest.Member {
		s := inboxStore(t, pool, group, inbox.Owner(name))
		eff := inboxEffect(name)
		h := s.BatchHandler(func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
			mu.Lock()
			batches++
			records += len(recs)
			mu.Unlock()
			for _, rec := range recs {
				if err := eff(ctx, tx, rec); err != nil {
					return err
				}
			}
			return nil
		})
		return kafkatest.Start(t, name, franzSource(t, group, topic), 30*time.Second,
			runner.HandleBatch(topic, h, runner.BatchSize(size), runner.BatchWait(2*time.Millisecond)),
			runner.OnAssign(s.AssignHook()), runner.Logger(kafkatest.Logger(t)),
			runner.CommitInterval(200*time.Millisecond), runner.DrainBudget(5*time.Second),
			runner.Backoff(20*time.Millisecond, 500*time.Millisecond), runner.Concurrency(8))
	}
	m1 := member("m1")
	m2 := member("m2")
	inboxWaitAtLeast(t, pool, int64(n/2), time.Minute, `SELECT count(*) FROM effects`)
	m1.Stop(t)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 2*time.Minute)
	m2.Stop(t)
	inboxExactlyOnce(t, pool, n)
	mu.Lock()
	defer mu.Unlock()
	mean := float64(records) / float64(batches)
	t.Logf("%d batches, mean %.1f records; effects by m1 %d, by m2 %d", batches, mean,
		inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'm1'"), inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'm2'"))
	if mean < 4 {
		t.Errorf("a mean batch of %.1f records, want well above one with a backlog", mean)
	}
}
