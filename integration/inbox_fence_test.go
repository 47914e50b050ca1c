//go:build integration

package integration_test

// What the fence costs the server: multixacts (which share locks on one
// row create when two transactions hold them at once, and which force
// anti-wraparound vacuums once autovacuum_multixact_freeze_max_age of them
// have been used) and transactions per second.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxMultixacts returns how many multixact ids the database has used so
// far (the age of its oldest unfrozen one; nothing here vacuums).
func inboxMultixacts(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	return inboxCount(t, pool, "SELECT mxid_age(datminmxid)::bigint FROM pg_database WHERE datname = current_database()")
}

// inboxFenceLoad applies n records, one per transaction, from conc
// goroutines over partitions partitions of s (leases already taken), and
// returns the transactions per second and the multixacts used meanwhile.
func inboxFenceLoad(t testing.TB, pool *pgxpool.Pool, s *inbox.Store, n, conc, partitions int) (perSec float64, multixacts int64) {
	t.Helper()
	h := s.Handler(inboxEffect("fence"))
	before := inboxMultixacts(t, pool)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if err := h(context.Background(), inboxRec("t", int32(i%int64(partitions)), i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	perSec = float64(n) / time.Since(start).Seconds()
	return perSec, inboxMultixacts(t, pool) - before
}

// TestInboxFenceCreatesNoMultixacts: 4,000 records, one per transaction,
// from 8 goroutines on one partition (every commit's fence looks at the
// same lease row) under READ COMMITTED, the default, use (almost) no
// multixact ids: the fence's lock is not a row lock. The bound leaves room
// for other tests using the same server at the same time.
func TestInboxFenceCreatesNoMultixacts(t *testing.T) {
	t.Parallel()
	const n, conc = 4000, 8
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g")
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	perSec, mx := inboxFenceLoad(t, pool, s, n, conc, 1)
	t.Logf("%d transactions from %d goroutines on one partition: %.0f/s, %d multixacts", n, conc, perSec, mx)
	if mx > n/100 {
		t.Fatalf("%d transactions used %d multixact ids (%.2f per transaction), want at most %d", n, mx, float64(mx)/n, n/100)
	}
	inboxExactlyOnceNoOrder(t, pool, n)
}

// inboxExactlyOnceNoOrder checks that every one of n records has exactly
// one effect row and one inbox row.
func inboxExactlyOnceNoOrder(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	effects := inboxCount(t, pool, "SELECT count(*) FROM effects")
	distinct := inboxCount(t, pool, `SELECT count(*) FROM (SELECT DISTINCT partition, "offset" FROM effects) d`)
	rows := inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox")
	if effects != int64(n) || distinct != int64(n) || rows != int64(n) {
		t.Fatalf("%d effects (%d distinct records) and %d inbox rows, want %d of each", effects, distinct, rows, n)
	}
}

// inboxRowLockFence is the fence of schema version 1 (inboxV1FenceBody):
// the lease row FOR SHARE at every isolation level. BenchmarkInboxFence
// puts it back to compare.
const inboxRowLockFence = `CREATE OR REPLACE FUNCTION tidemark_inbox_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$` + inboxV1FenceBody + `$fence$`

// BenchmarkInboxFence measures the fence's cost: transactions per second
// and multixacts per transaction, one record per transaction from 8
// goroutines, on one partition and on six: with the fence as migrated
// (fence), with the row-lock fence of schema version 1 (row-lock), and
// with the trigger disabled (off: no fencing at all, the floor). Run it
// with -benchtime=1x; each iteration applies 4,000 records.
func BenchmarkInboxFence(b *testing.B) {
	const n, conc = 4000, 8
	for _, partitions := range []int{1, 6} {
		for _, fence := range []string{"fence", "row-lock", "off"} {
			b.Run(fmt.Sprintf("%s-partitions-%d", fence, partitions), func(b *testing.B) {
				for range b.N {
					pool := inboxDB(b)
					var err error
					switch fence {
					case "row-lock":
						_, err = pool.Exec(context.Background(), inboxRowLockFence)
					case "off":
						_, err = pool.Exec(context.Background(), "ALTER TABLE tidemark_inbox DISABLE TRIGGER tidemark_inbox_fence")
					}
					if err != nil {
						b.Fatal(err)
					}
					s := inboxStore(b, pool, "g")
					for p := range int32(partitions) {
						inboxTake(b, s, runner.TP{Topic: "t", Partition: p}, -1)
					}
					perSec, mx := inboxFenceLoad(b, pool, s, n, conc, partitions)
					b.ReportMetric(perSec, "tx/s")
					b.ReportMetric(float64(mx)/n, "multixacts/tx")
				}
			})
		}
	}
}

// inboxLockWaiters returns how many sessions wait for a lock of the kind
// ('advisory', 'tuple', 'transactionid') now.
func inboxLockWaiters(t testing.TB, pool *pgxpool.Pool, kind string) int64 {
	t.Helper()
	return inboxCount(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE NOT l.granted AND l.locktype = $1 AND a.application_name = current_setting('application_name')`, kind)
}

// inboxWaitFor polls cond for up to 10s.
func inboxWaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestInboxFenceCommitWindow forces, at each isolation level, the two
// orders of an old owner's COMMIT and a lease bump, with the old owner
// really inside COMMIT: a deferred trigger of the test on the effects
// table, queued after the inbox row's fence, waits on an advisory lock the
// test holds, so the old owner's fence has run and holds what it holds.
//
//  1. The fence ran first: the bump waits until the old owner's commit is
//     done, and the old owner's effect is committed.
//  2. The bump came first (a transaction that moved the lease and has not
//     committed): the old owner's fence waits for it, then sees the new
//     epoch — or, under REPEATABLE READ, fails to serialize and is run
//     again by the Store, whose claim then sees it: fenced either way.
func TestInboxFenceCommitWindow(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			if _, err := pool.Exec(ctx, `CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN PERFORM pg_advisory_xact_lock(4711); RETURN NULL; END $$;
				CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
				FOR EACH ROW WHEN (NEW.value = 'hold') EXECUTE FUNCTION hold()`); err != nil {
				t.Fatal(err)
			}
			tp := runner.TP{Topic: "t", Partition: 0}
			opts := inbox.TxOptions(pgx.TxOptions{IsoLevel: iso})
			a := inboxStore(t, pool, "g", inbox.Owner("a"), opts)
			b := inboxStore(t, pool, "g", inbox.Owner("b"), opts)
			inboxTake(t, a, tp, -1)

			// 1. The old owner's fence first.
			holder, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release()
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(4711)"); err != nil {
				t.Fatal(err)
			}
			rec := inboxRec("t", 0, 1)
			rec.Value = []byte("hold")
			aDone := make(chan error, 1)
			go func() { aDone <- a.Handler(inboxEffect("a"))(ctx, rec) }()
			inboxWaitFor(t, "a's COMMIT inside the test's trigger", func() bool { return inboxLockWaiters(t, pool, "advisory") == 1 })
			bumped := make(chan error, 1)
			go func() {
				_, err := b.AssignHook()(ctx, []runner.Assignment{{TP: tp, Start: -1}})
				bumped <- err
			}()
			inboxWaitFor(t, "the bump waiting", func() bool {
				return inboxLockWaiters(t, pool, "advisory")+inboxLockWaiters(t, pool, "tuple")+inboxLockWaiters(t, pool, "transactionid") >= 2
			})
			select {
			case err := <-bumped:
				t.Fatalf("the bump returned (%v) while the old owner was inside COMMIT after its fence", err)
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(4711)"); err != nil {
				t.Fatal(err)
			}
			if err := <-aDone; err != nil {
				t.Fatalf("the old owner's commit that began before the bump: %v", err)
			}
			if err := <-bumped; err != nil {
				t.Fatal(err)
			}
			if e, _ := b.Epoch(tp); e != 2 {
				t.Fatalf("b's epoch %d, want 2", e)
			}

			// 2. The bump first. Give the partition back to a, then move
			// the lease in a transaction that stays open.
			inboxTake(t, a, tp, -1) // epoch 3
			mover, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mover.Rollback(ctx) //nolint:errcheck
			if _, err := mover.Exec(ctx, `UPDATE tidemark_lease SET epoch = epoch + 1, owner = 'mover' WHERE group_id = 'g' AND topic = 't' AND partition = 0`); err != nil {
				t.Fatal(err)
			}
			go func() { aDone <- a.Handler(inboxEffect("a"))(ctx, inboxRec("t", 0, 2)) }()
			inboxWaitFor(t, "a's COMMIT waiting for the bump", func() bool {
				return inboxLockWaiters(t, pool, "advisory")+inboxLockWaiters(t, pool, "tuple")+inboxLockWaiters(t, pool, "transactionid") >= 1
			})
			if err := mover.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-aDone; !errors.Is(err, runner.ErrFenced) {
				t.Fatalf("the old owner's commit after the bump: %v, want ErrFenced", err)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = 2`); n != 0 {
				t.Fatalf("%d effects of the fenced record", n)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = 1`); n != 1 {
				t.Fatalf("%d effects of the record committed before the bump, want 1", n)
			}
		})
	}
}
