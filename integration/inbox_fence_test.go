//go:build integration

package integration_test

// What the fence costs the server: multixacts (which share locks on one
// row create when two transactions hold them at once, and which force
// anti-wraparound vacuums once autovacuum_multixact_freeze_max_age of them
// have been used) and transactions per second.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkInboxFence measures the fence's cost: transactions per second
// and multixacts per transaction, one record per transaction from 8
// goroutines, on one partition and on six, with the fence as migrated and
// with its trigger disabled (no fencing at all: the floor). Run it with
// -benchtime=1x; each iteration applies 4,000 records.
func BenchmarkInboxFence(b *testing.B) {
	const n, conc = 4000, 8
	for _, partitions := range []int{1, 6} {
		for _, fence := range []bool{true, false} {
			name := "fence"
			if !fence {
				name = "trigger-off"
			}
			b.Run(name+"-partitions-"+string(rune('0'+partitions)), func(b *testing.B) {
				for range b.N {
					pool := inboxDB(b)
					if !fence {
						if _, err := pool.Exec(context.Background(), "ALTER TABLE tidemark_inbox DISABLE TRIGGER tidemark_inbox_fence"); err != nil {
							b.Fatal(err)
						}
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
