package pgtrace_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/pgtrace"
)

// TestRoundTrips: each query, batch and prepare start is one round trip,
// counted by kind; a batch's own queries and the end callbacks count
// nothing; Reset starts again from zero.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	var r pgtrace.RoundTrips
	for range 3 {
		r.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{})
		r.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{})
	}
	for range 2 {
		r.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{})
		r.TraceBatchQuery(ctx, nil, pgx.TraceBatchQueryData{})
		r.TraceBatchQuery(ctx, nil, pgx.TraceBatchQueryData{})
		r.TraceBatchEnd(ctx, nil, pgx.TraceBatchEndData{})
	}
	r.TracePrepareStart(ctx, nil, pgx.TracePrepareStartData{})
	r.TracePrepareEnd(ctx, nil, pgx.TracePrepareEndData{})
	if q, b, p, n := r.Queries.Load(), r.Batches.Load(), r.Prepares.Load(), r.Total(); q != 3 || b != 2 || p != 1 || n != 6 {
		t.Fatalf("%d queries, %d batches, %d prepares, total %d; want 3, 2, 1, 6", q, b, p, n)
	}
	r.Reset()
	if n := r.Total(); n != 0 {
		t.Fatalf("total %d after Reset, want 0", n)
	}
}
