// Package pgtrace counts the round trips a pgx connection makes to
// PostgreSQL, for the tests that bound them and the benchmark harness
// that reports them. It is not test code: it depends on pgx alone.
package pgtrace

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer (set it as pgx.ConnConfig.Tracer) that counts
// the requests a connection sends, each one round trip: a query (Exec,
// Query, QueryRow, a transaction's BEGIN, COMMIT or ROLLBACK), a batch
// (one pipeline, sent at once), and a statement pgx prepares before its
// first use on a connection. The zero RoundTrips is ready to use; it is
// safe for concurrent use, so one can trace every connection of a pool.
type RoundTrips struct {
	Queries, Batches, Prepares atomic.Int64
}

var (
	_ pgx.QueryTracer   = (*RoundTrips)(nil)
	_ pgx.BatchTracer   = (*RoundTrips)(nil)
	_ pgx.PrepareTracer = (*RoundTrips)(nil)
)

// Total is the round trips counted since the last Reset, prepares
// included.
func (r *RoundTrips) Total() int64 {
	return r.Queries.Load() + r.Batches.Load() + r.Prepares.Load()
}

// Reset sets the counts to zero.
func (r *RoundTrips) Reset() { r.Queries.Store(0); r.Batches.Store(0); r.Prepares.Store(0) }

// TraceQueryStart counts a query.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.Queries.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.Batches.Add(1)
	return ctx
}

// TraceBatchQuery does nothing: a batch's queries travel in its one round
// trip.
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TracePrepareStart counts a prepare.
func (r *RoundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.Prepares.Add(1)
	return ctx
}

// TracePrepareEnd does nothing.
func (r *RoundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}
