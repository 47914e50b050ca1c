//go:build integration

package integration_test

// Inbox handoffs through real Kafka rebalances of one group (invariant 7):
// an old owner's COMMIT after the partition moved is fenced. The members
// and the spy are in member_test.go and spy_test.go.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// heldEffect is an old owner's handler: the inbox handler of s whose effect,
// for the record at offset held of each partition, writes its row and then
// waits for release before returning, and which records what the handler
// returned for those records.
//
// It hands the inbox a ctx that is never cancelled. The runner cancels a
// revoked or lost partition's handlers, and a COMMIT sent with a cancelled
// ctx never reaches PostgreSQL, so the fence would not be what stops it.
// A paused process (GC, SIGSTOP, a frozen VM) that resumes after the
// handoff, or a COMMIT already on the wire when the loss is noticed, gets
// there all the same: the fence in the database must refuse it on its own.
type heldEffect struct {
	held    int64
	release chan struct{}
	inside  chan runner.TP // each partition's held record, once in its effect

	mu   sync.Mutex
	errs map[int32]error // partition → the held record's handler result
}

func newHeldEffect(held int64) *heldEffect {
	return &heldEffect{held: held, release: make(chan struct{}), inside: make(chan runner.TP, 16), errs: map[int32]error{}}
}

func (g *heldEffect) handler(s *inbox.Store, owner string) runner.Handler {
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if err := inboxEffect(owner)(ctx, tx, rec); err != nil {
			return err
		}
		if rec.Offset == g.held {
			g.inside <- rec.TP()
			<-g.release
		}
		return nil
	})
	return func(ctx context.Context, rec runner.Record) error {
		err := h(context.WithoutCancel(ctx), rec)
		if rec.Offset == g.held {
			g.mu.Lock()
			g.errs[rec.Partition] = err
			g.mu.Unlock()
		}
		return err
	}
}

// free releases the held effects; later calls do nothing.
func (g *heldEffect) free() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// waitLockWaiter waits until a PostgreSQL backend is waiting on a lock: the
// new owner's claim of the held record waits on the old owner's
// uncommitted inbox row.
func waitLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	inboxWaitRows(t, pool, 1, time.Minute,
		`SELECT least(count(*), 1) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND application_name = current_setting('application_name')`)
}

// startInboxFranz starts an inbox member over a franz Source in group,
// wrapped by a spySource on log.
func startInboxFranz(t *testing.T, log *spyLog, name, group, topic string, s *inbox.Store, h runner.Handler, fopts []franz.Option, ropts ...runner.Option) *kafkatest.Member {
	t.Helper()
	src := &spySource{Source: franzSource(t, group, topic, fopts...), name: name, log: log}
	return runMember(t, name, src, topic, h, append([]runner.Option{
		runner.OnAssign(s.AssignHook()), runner.Backoff(20*time.Millisecond, 500*time.Millisecond)}, ropts...)...)
}

// TestInboxHandoffRevoke: two inbox members of ONE group; a partition moves
// from A to B through a real cooperative rebalance while A's handler is in
// the middle of the partition's effect (row written, not committed). A owns
// both partitions and is held on offset 50 of each; B joins, A's revoke
// drain runs out (DrainBudget 1 s), A commits offset 50, and B takes the
// lease of the partition it got and replays offset 50, whose claim waits
// on A's uncommitted row. Then A's effects go on: on the partition that
// moved, A's COMMIT is fenced (inbox.FencedError, runner.ErrFenced) and
// B applies the record; on the one A kept, A's COMMIT succeeds. Every
// record has exactly one effect and one inbox row, in key order. A fence
// that let A's late COMMIT through leaves A's effect on the moved
// partition and no FencedError; a lease bump that did not wait, or a
// replay filter that missed A's rows, leaves two effects for a record.
func TestInboxHandoffRevoke(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, keys, held = 600, 20, 50
	pool := inboxDB(t)
	topic, group := bed.Topic(t, 2), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })
	if ends := bed.EndOffsets(t, topic); ends[0] <= held || ends[1] <= held {
		t.Fatalf("partitions end at %v; both need a record at offset %d", ends, held)
	}

	g := newHeldEffect(held)
	defer g.free() // let the members stop on a failure path
	sa := inboxStore(t, pool, group, inbox.Owner("a"))
	sb := inboxStore(t, pool, group, inbox.Owner("b"))
	log := newSpyLog()
	a := startInboxFranz(t, log, "a", group, topic, sa, g.handler(sa, "a"), nil, runner.DrainBudget(time.Second))
	for range 2 {
		select {
		case <-g.inside:
		case <-time.After(time.Minute):
			t.Fatal("A never reached the held records")
		}
	}
	waitCommitted(t, group, topic, map[int32]int64{0: held, 1: held}, time.Minute)

	b := startInboxFranz(t, log, "b", group, topic, sb, sb.Handler(inboxEffect("b")), nil)
	inboxWaitRows(t, pool, 1, time.Minute, "SELECT count(*) FROM tidemark_lease WHERE owner = 'b'")
	var moved int32
	if err := pool.QueryRow(context.Background(), "SELECT partition FROM tidemark_lease WHERE owner = 'b'").Scan(&moved); err != nil {
		t.Fatal(err)
	}
	waitLockWaiter(t, pool)
	if got := bed.Committed(t, group, topic)[moved]; got != held {
		t.Fatalf("partition %d committed %d while A's transaction held offset %d", moved, got, held)
	}
	if log.ownedBy("a") != 1 {
		t.Fatalf("A owns %d partitions after the rebalance, want 1 (it kept one, revoked the other)", log.ownedBy("a"))
	}
	g.free()
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	b.Stop(t)
	a.Stop(t)

	g.mu.Lock()
	defer g.mu.Unlock()
	for p := range int32(2) {
		err := g.errs[p]
		var fe *inbox.FencedError
		switch {
		case p == moved && (!errors.As(err, &fe) || !errors.Is(err, runner.ErrFenced)):
			t.Errorf("partition %d moved to B: A's late COMMIT of offset %d returned %v, want an inbox.FencedError", p, held, err)
		case p != moved && err != nil:
			t.Errorf("partition %d stayed with A: its COMMIT of offset %d returned %v, want nil", p, held, err)
		}
		want := map[bool]string{true: "b", false: "a"}[p == moved]
		if c := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE partition = $1 AND "offset" = $2 AND owner = $3`, p, held, want); c != 1 {
			t.Errorf("partition %d offset %d: the effect is not %s's", p, held, want)
		}
	}
	inboxExactlyOnce(t, pool, n)
	t.Logf("partition %d moved; A %+v; B %+v", moved, sa.Stats(), sb.Stats())
}

// TestInboxHandoffLost: the same handoff through a lost partition. A owns
// the one partition and is held in the effect of offset 50; B is a member
// of the same group with nothing assigned. A is cut off from Kafka (every
// connection closed, every dial refused; PostgreSQL stays reachable), so
// its heartbeats stop: the broker expires its 2 s session and gives the
// partition to B, whose lease bump and replay of offset 50 wait on A's
// uncommitted row. The commit stays at 50. When A's effect goes on, its
// COMMIT is fenced, B applies the record, and every record has exactly one
// effect and one inbox row, in key order. What breaking looks like is as in
// TestInboxHandoffRevoke.
func TestInboxHandoffLost(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, keys, held = 200, 10, 50 // key-0 has offsets 0, 10, ...: 15 from 50 on
	pool := inboxDB(t)
	topic, group := bed.Topic(t, 1), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })

	g := newHeldEffect(held)
	defer g.free()
	sa := inboxStore(t, pool, group, inbox.Owner("a"))
	sb := inboxStore(t, pool, group, inbox.Owner("b"))
	log := newSpyLog()
	sw := &netSwitch{}
	defer sw.restore()
	short := []franz.Option{franz.SessionTimeout(2 * time.Second), franz.HeartbeatInterval(200 * time.Millisecond),
		franz.RebalanceTimeout(5 * time.Second)}
	a := startInboxFranz(t, log, "a", group, topic, sa, g.handler(sa, "a"),
		append(short, franz.ClientOptions(kgo.Dialer(sw.dial))), runner.DrainBudget(time.Second))
	select {
	case <-g.inside:
	case <-time.After(time.Minute):
		t.Fatal("A never reached the held record")
	}
	inboxWaitRows(t, pool, n-15, time.Minute, "SELECT count(*) FROM effects")
	waitCommitted(t, group, topic, map[int32]int64{0: held}, time.Minute)
	b := startInboxFranz(t, log, "b", group, topic, sb, sb.Handler(inboxEffect("b")), short)
	kafkatest.WaitFor(t, time.Minute, "B in the group", func() bool { return len(bed.Members(t, group)) == 2 })

	sw.cut()
	cutAt := time.Now()
	inboxWaitRows(t, pool, 1, time.Minute, "SELECT count(*) FROM tidemark_lease WHERE owner = 'b'")
	movedAfter := time.Since(cutAt)
	waitLockWaiter(t, pool)
	if got := bed.Committed(t, group, topic)[0]; got != held {
		t.Fatalf("committed %d while A's transaction held offset %d", got, held)
	}
	kafkatest.WaitFor(t, 10*time.Second, "A reports the partition lost", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return log.lost["a"] > 0
	})
	g.free()
	waitCommitted(t, group, topic, map[int32]int64{0: n}, time.Minute)
	sw.restore()
	a.Stop(t)
	b.Stop(t)

	g.mu.Lock()
	err := g.errs[0]
	g.mu.Unlock()
	var fe *inbox.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, runner.ErrFenced) {
		t.Errorf("A's late COMMIT of offset %d returned %v, want an inbox.FencedError", held, err)
	}
	if c := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = $1 AND owner = 'b'`, held); c != 1 {
		t.Errorf("offset %d: the effect is not B's", held)
	}
	inboxExactlyOnce(t, pool, n)
	t.Logf("B took the lease %v after the cut; A %+v; B %+v", movedAfter.Round(time.Millisecond), sa.Stats(), sb.Stats())
}
