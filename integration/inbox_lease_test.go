//go:build integration

package integration_test

// The assign hook and the lease: what one assignment costs, and that the
// member the group coordinator says owns a partition is never left fenced.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/internal/pgtrace"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// inboxTracedPool is a pool like base (same database and search_path)
// whose requests tr counts.
func inboxTracedPool(t testing.TB, base *pgxpool.Pool, maxConns int32, tr pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := base.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestInboxAssignHookOneRoundTrip: an assignment of 12 partitions takes
// their leases and loads their applied offsets in one round trip, not two
// per partition (counted on the second assignment, once pgx has prepared
// the statements on its connection), and the filters it returns are the
// partitions' own.
func TestInboxAssignHookOneRoundTrip(t *testing.T) {
	t.Parallel()
	const partitions = 12
	ctx := context.Background()
	base := inboxDB(t)
	tr := &pgtrace.RoundTrips{}
	pool := inboxTracedPool(t, base, 1, tr)
	s := inboxStore(t, pool, "g")
	as := make([]runner.Assignment, partitions)
	for p := range as {
		as[p] = runner.Assignment{TP: runner.TP{Topic: "t", Partition: int32(p)}, Start: -1}
		if p%2 == 1 {
			as[p].Start = 0
		}
	}
	if _, err := s.AssignHook()(ctx, as); err != nil {
		t.Fatal(err)
	}
	h := s.Handler(inboxEffect("a"))
	for p := range int32(partitions) {
		if err := h(ctx, inboxRec("t", p, int64(p))); err != nil { // partition p applied offset p
			t.Fatal(err)
		}
	}
	tr.Reset()
	filters, err := s.AssignHook()(ctx, as)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.Total(); n != 1 {
		t.Fatalf("an assignment of %d partitions took %d round trips (%d queries, %d batches, %d prepares), want 1",
			partitions, n, tr.Queries.Load(), tr.Batches.Load(), tr.Prepares.Load())
	}
	for p, f := range filters {
		for off := int64(0); off < partitions; off++ {
			if got, want := f != nil && f(off), off == int64(p); got != want {
				t.Fatalf("partition %d's filter(%d) = %v, want %v", p, off, got, want)
			}
		}
		if e, ok := s.Epoch(as[p].TP); !ok || e != 2 {
			t.Fatalf("partition %d's epoch %d (%v), want 2", p, e, ok)
		}
	}
}

// inboxOwnerMember is one member of group over adapter ("franz",
// "franz-kip848" or "kafkago") whose Store s (made by store, given the
// member's Source as its coordinator) applies inboxEffect(name).
type inboxOwnerMember struct {
	s    *inbox.Store
	r    *runner.Runner
	done chan error
}

func startInboxOwnerMember(t *testing.T, adapter, name, group, topic string, pool *pgxpool.Pool, opts ...inbox.Option) *inboxOwnerMember {
	t.Helper()
	var src runner.Source
	var coord inbox.Coordinator
	var err error
	switch adapter {
	case "franz", "franz-kip848":
		fopts := []franz.Option{franz.Logger(kafkatest.Logger(t)), franz.SessionTimeout(6 * time.Second), franz.RebalanceTimeout(6 * time.Second),
			franz.HeartbeatInterval(500 * time.Millisecond)}
		if adapter == "franz-kip848" {
			fopts = append(fopts, franz.ServerSideAssignment())
		}
		var f *franz.Source
		f, err = franz.New(bed.Kafka(t), group, []string{topic}, fopts...)
		src, coord = f, f
	case "kafkago":
		var k *kafkago.Source
		k, err = kafkago.New(bed.Kafka(t), group, []string{topic}, kafkago.Logger(kafkatest.Logger(t)),
			kafkago.SessionTimeout(6*time.Second), kafkago.RebalanceTimeout(6*time.Second))
		src, coord = k, k
	}
	if err != nil {
		t.Fatal(err)
	}
	s := inboxStore(t, pool, group, append([]inbox.Option{inbox.Owner(name), inbox.Owners(coord)}, opts...)...)
	r, err := runner.New(src, runner.Handle(topic, s.Handler(inboxEffect(name))), runner.OnAssign(s.AssignHook()),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(50*time.Millisecond), runner.Backoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := &inboxOwnerMember{s: s, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil && !errors.Is(err, runner.ErrStopped) {
			t.Errorf("member %s: Shutdown: %v", name, err)
		}
		<-m.done
	})
	return m
}

// TestInboxStaleBumpIsTakenBack: the partition's owner — the member the
// group coordinator says has it — is never left fenced by a lease bump
// that reached the database late from an assignment that ended (another
// member's assign hook, retried through a database outage after the
// group had moved the partition). The owner's next record is refused,
// the owner asks the coordinator (DescribeGroups, or ConsumerGroupDescribe
// under KIP-848), finds it is the owner, takes the lease back and applies
// its records, within a second here. Both adapters, the classic protocol
// and KIP-848, and with Batch. Before, every later record of the partition
// was FencedError and dropped, and the group's commit never passed the
// first of them; with Batch, the lease was taken back but the refused
// batch was not run again, the same.
func TestInboxStaleBumpIsTakenBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, adapter string
		opts          []inbox.Option
	}{
		{"franz", "franz", nil},
		{"franz-kip848", "franz-kip848", nil},
		{"kafkago", "kafkago", nil},
		{"franz-batch", "franz", []inbox.Option{inbox.Batch(8)}},
	} {
		adapter := tc.adapter
		t.Run(tc.name, func(t *testing.T) {
			const n1, n2 = 100, 100
			pool := inboxDB(t)
			topic := bed.Topic(t, 1)
			group := bed.Group(t)
			key := func(i int) string { return fmt.Sprintf("key-%d", i%10) }
			bed.Produce(t, topic, n1, key)
			b := startInboxOwnerMember(t, adapter, "b", group, topic, pool, tc.opts...)
			waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)

			// The stale hook: the lease moves to an assignment the group
			// coordinator no longer knows.
			stale := inboxStore(t, pool, group, inbox.Owner("stale"))
			if _, err := stale.AssignHook()(context.Background(), []runner.Assignment{{
				TP: runner.TP{Topic: topic, Partition: 0}, Start: -1, Generation: 1, Member: "a-member-long-gone"}}); err != nil {
				t.Fatal(err)
			}
			bed.Produce(t, topic, n2, key)
			start := time.Now()
			waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 30*time.Second)
			t.Logf("the owner applied the records after the stale bump in %v; %+v", time.Since(start).Round(time.Millisecond), b.s.Stats())
			if o := inboxCount(t, pool, "SELECT count(*) FROM tidemark_lease WHERE owner = 'b'"); o != 1 {
				t.Fatal("the owner does not hold the lease at the end")
			}
			inboxExactlyOnce(t, pool, n1+n2)
		})
	}
}

// TestInboxOutageLeavesNoPartitionFenced is the late bump for real, under
// the classic protocol (franz-go, cooperative-sticky): member A is given
// the partition while it cannot reach the database, and its assign hook
// retries — franz-go runs the callback to its end before it can leave a
// generation — while B joins. The rebalance cannot finish with A, which
// the group removes after the rebalance timeout; B gets the partition,
// takes its lease and applies the records. Then A's database comes back
// and A's hook, still retrying, bumps the lease: the late bump. The
// member the coordinator says owns the partition (B, unless the next
// rebalance gives it to A) applies the records produced after it, within
// seconds, exactly once.
func TestInboxOutageLeavesNoPartitionFenced(t *testing.T) {
	t.Parallel()
	const n1, n2 = 100, 200
	ctx := context.Background()
	pool := inboxDB(t)
	topic := bed.Topic(t, 1)
	group := bed.Group(t)
	key := func(i int) string { return fmt.Sprintf("key-%d", i%10) }
	bed.Produce(t, topic, n1, key)

	sw := &netSwitch{}
	sw.refuse()
	cfg := pool.Config().Copy()
	cfg.ConnConfig.DialFunc = sw.dial
	apool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer apool.Close()
	startInboxOwnerMember(t, "franz", "a", group, topic, apool)
	adm := bed.Admin(t)
	inboxWaitFor(t, "A assigned the partition", func() bool {
		d, err := adm.DescribeGroups(ctx, group)
		if err != nil || d.Error() != nil {
			return false
		}
		g := d[group]
		return g.State == "Stable" && len(g.AssignedPartitions()[topic]) == 1
	})
	b := startInboxOwnerMember(t, "franz", "b", group, topic, pool)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'b'"); n != n1 {
		t.Fatalf("B applied %d of the %d records", n, n1)
	}
	sw.restore()
	inboxWaitRows(t, pool, 1, 30*time.Second, "SELECT count(*) FROM tidemark_lease WHERE owner = 'a'")
	bed.Produce(t, topic, n2, key)
	start := time.Now()
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 30*time.Second)
	t.Logf("the partition's records after the late bump applied in %v; B %+v", time.Since(start).Round(time.Millisecond), b.s.Stats())
	inboxExactlyOnce(t, pool, n1+n2)
}

// TestInboxGroupWhoseGenerationsRestarted: a group's metadata is deleted
// (the group deleted, or empty past offsets.retention.minutes) and its
// generations start again at 1 (member epochs, under KIP-848). The leases
// record no generation, and a bump is never refused for being older, so
// the group's next member takes every lease and applies the new records
// without an operator; what was applied before is not applied again (the
// inbox rows). It guards that property against a lease ordered by the
// generation, which would fence such a group for good.
func TestInboxGroupWhoseGenerationsRestarted(t *testing.T) {
	t.Parallel()
	for _, adapter := range []string{"franz", "franz-kip848"} {
		t.Run(adapter, func(t *testing.T) {
			const n = 50
			pool := inboxDB(t)
			topic := bed.Topic(t, 2)
			group := bed.Group(t)
			key := func(i int) string { return fmt.Sprintf("key-%d", i%10) }
			for round := range 3 { // generations grow
				bed.Produce(t, topic, n, key)
				m := startInboxOwnerMember(t, adapter, fmt.Sprint("m", round), group, topic, pool)
				waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if err := m.r.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
			inboxDeleteGroup(t, group)
			bed.Produce(t, topic, n, key)
			startInboxOwnerMember(t, adapter, "after", group, topic, pool)
			waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
			inboxExactlyOnce(t, pool, 4*n)
			if got := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'after'"); got != n {
				t.Fatalf("the member after the restart applied %d records, want the %d new ones", got, n)
			}
		})
	}
}
