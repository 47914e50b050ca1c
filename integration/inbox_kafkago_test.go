//go:build integration

package integration_test

// The inbox over the kafkago adapter, through its eager rebalances.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// TestInboxKafkago: the inbox over the kafkago adapter. 3,000 keyed records
// over three partitions; a second member joins a third of the way through
// and the first shuts down at two thirds, so every partition moves through
// kafka-go's eager rebalances. Every record has exactly one effect and one
// inbox row, each key's effects are in offset order, both members applied
// some, and the group committed the end offsets. An adapter whose revoke
// committed past an unfinished record, or whose new owner did not run the
// assign hook first (lease and replay filter), fails it.
func TestInboxKafkago(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, partitions, keys = 3000, 3, 100
	pool := inboxDB(t)
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })

	slow := func(owner string) inbox.Effect {
		eff := inboxEffect(owner)
		return func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			time.Sleep(time.Millisecond)
			return eff(ctx, tx, rec)
		}
	}
	start := func(name string) *kafkatest.Member {
		src, err := kafkago.New(bed.Kafka(t), group, []string{topic},
			kafkago.SessionTimeout(6*time.Second), kafkago.RebalanceTimeout(10*time.Second),
			kafkago.HeartbeatInterval(500*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)))
		if err != nil {
			t.Fatalf("kafkago.New: %v", err)
		}
		s := inboxStore(t, pool, group, inbox.Owner(name))
		return runMember(t, name, src, topic, s.Handler(slow(name)), runner.OnAssign(s.AssignHook()),
			runner.Backoff(20*time.Millisecond, 500*time.Millisecond), runner.Concurrency(16))
	}
	m1 := start("m1")
	inboxWaitAtLeast(t, pool, int64(n/3), time.Minute, `SELECT count(*) FROM effects`)
	m2 := start("m2")
	inboxWaitAtLeast(t, pool, 1, time.Minute, `SELECT count(*) FROM effects WHERE owner = 'm2'`)
	inboxWaitAtLeast(t, pool, int64(2*n/3), time.Minute, `SELECT count(*) FROM effects`)
	m1.Stop(t)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	m2.Stop(t)
	inboxExactlyOnce(t, pool, n)
	by := map[string]int64{}
	for _, o := range []string{"m1", "m2"} {
		by[o] = inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = $1", o)
	}
	if by["m1"] == 0 || by["m2"] == 0 {
		t.Fatalf("effects per member %v: want both > 0", by)
	}
	t.Logf("effects per member %v", by)
}
