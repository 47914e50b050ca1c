//go:build integration

package integration_test

// The assign hook and the lease: what one assignment costs, and that the
// member the group coordinator says owns a partition is never left fenced.

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxRoundTrips is a pgx tracer counting the requests a pool sends: each
// query (Exec, Query, QueryRow, a transaction's BEGIN, COMMIT or ROLLBACK)
// and each batch (a pipeline, sent at once) is one round trip, and so is
// each statement pgx prepares before first using it on a connection.
type inboxRoundTrips struct {
	queries, batches, prepares atomic.Int64
}

func (r *inboxRoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.queries.Add(1)
	return ctx
}
func (r *inboxRoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *inboxRoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *inboxRoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *inboxRoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *inboxRoundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.prepares.Add(1)
	return ctx
}
func (r *inboxRoundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// total is the round trips counted, prepares included.
func (r *inboxRoundTrips) total() int64 {
	return r.queries.Load() + r.batches.Load() + r.prepares.Load()
}

func (r *inboxRoundTrips) reset() { r.queries.Store(0); r.batches.Store(0); r.prepares.Store(0) }

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
	const partitions = 12
	ctx := context.Background()
	base := inboxDB(t)
	tr := &inboxRoundTrips{}
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
	tr.reset()
	filters, err := s.AssignHook()(ctx, as)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.total(); n != 1 {
		t.Fatalf("an assignment of %d partitions took %d round trips (%d queries, %d batches, %d prepares), want 1",
			partitions, n, tr.queries.Load(), tr.batches.Load(), tr.prepares.Load())
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
