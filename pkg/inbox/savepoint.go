package inbox

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// savepointTx is the pgx.Tx an Effect gets inside a batch. The record's
// SAVEPOINT travels in the same round trip as the effect's first statement
// (a pipeline), so isolating a record costs no round trip of its own — on
// a server where commits are cheap, round trips are what a batch saves.
// Everything else passes through to the batch's transaction. Commit and
// Rollback are refused: the transaction is the batch's.
//
// Each record of a batch has a savepoint name of its own, and state says
// whether it was established: rolling back to a savepoint that was never
// made must fail, not roll back the previous record's.
type savepointTx struct {
	pgx.Tx
	ctx   context.Context // the batch's, for the calls that take none
	name  string
	state spState
}

type spState uint8

const (
	spPending     spState = iota // nothing sent yet
	spEstablished                // the SAVEPOINT succeeded
	spFailed                     // the SAVEPOINT failed: the transaction is aborted
)

// errEndsTx is returned by Commit and Rollback of an Effect's pgx.Tx in a
// batch.
var errEndsTx = errors.New("inbox: an Effect must not commit or roll back the inbox's transaction")

// savepointNames are the names records of a batch use, by position.
var savepointNames = func() (names [maxBatch]string) {
	for i := range names {
		names[i] = "tidemark_inbox_" + strconv.Itoa(i+1)
	}
	return names
}()

func newSavepointTx(ctx context.Context, tx pgx.Tx, i int) *savepointTx {
	return &savepointTx{Tx: tx, ctx: ctx, name: savepointNames[i]}
}

// set records the SAVEPOINT's outcome.
func (t *savepointTx) set(err error) error {
	if err != nil {
		t.state = spFailed
		return err
	}
	t.state = spEstablished
	return nil
}

// flush sends the SAVEPOINT on its own, for the calls that cannot carry it.
func (t *savepointTx) flush(ctx context.Context) error {
	switch t.state {
	case spEstablished:
		return nil
	case spFailed:
		return errors.New("inbox: the record's savepoint failed; the transaction is aborted")
	}
	_, err := t.Tx.Exec(ctx, "SAVEPOINT "+t.name)
	return t.set(err)
}

// pipelined reports whether a statement with these arguments can share a
// pgx.Batch with the SAVEPOINT: a batch accepts no query option but a
// QueryRewriter (such as pgx.NamedArgs).
func pipelined(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

func (t *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.state != spPending || !pipelined(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.Tx.Exec(ctx, sql, args...)
	}
	if len(args) == 0 {
		// pgx runs an Exec without arguments over the simple protocol,
		// where sql may hold several statements; so does this.
		results, err := t.Tx.Conn().PgConn().Exec(ctx, "SAVEPOINT "+t.name+"; "+sql).ReadAll()
		if len(results) == 0 || results[0].Err != nil {
			if len(results) > 0 {
				err = results[0].Err
			} else if err == nil {
				err = errors.New("inbox: no result for the record's savepoint")
			}
			return pgconn.CommandTag{}, t.set(err)
		}
		t.state = spEstablished
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		return results[len(results)-1].CommandTag, nil
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + t.name)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return pgconn.CommandTag{}, t.set(err)
	}
	t.state = spEstablished
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.state != spPending || !pipelined(args) {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
		return t.Tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + t.name)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, t.set(err)
	}
	t.state = spEstablished
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return &oneRow{rows}
}

func (t *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.state != spPending {
		if err := t.flush(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return t.Tx.SendBatch(ctx, b)
	}
	for _, q := range b.QueuedQueries {
		if !pipelined(q.Arguments) {
			if err := t.flush(ctx); err != nil {
				return pgx.FailedBatchResults(b, err)
			}
			return t.Tx.SendBatch(ctx, b)
		}
	}
	// The SAVEPOINT goes first; its result is read here, so the caller
	// reads its own results from the first.
	sb := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: "SAVEPOINT " + t.name}}, b.QueuedQueries...)}
	br := t.Tx.SendBatch(ctx, sb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return pgx.FailedBatchResults(b, t.set(err))
	}
	t.state = spEstablished
	return br
}

func (t *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// LargeObjects and Conn hand out ways to run statements this wrapper does
// not see, so the SAVEPOINT is sent first (under the batch's context).
func (t *savepointTx) LargeObjects() pgx.LargeObjects {
	_ = t.flush(t.ctx) // a failure shows in the first large-object call
	return t.Tx.LargeObjects()
}

func (t *savepointTx) Conn() *pgx.Conn {
	_ = t.flush(t.ctx)
	return t.Tx.Conn()
}

func (t *savepointTx) Commit(context.Context) error   { return errEndsTx }
func (t *savepointTx) Rollback(context.Context) error { return errEndsTx }

// batchRows are the rows of a query that shared a pipeline with the
// SAVEPOINT: the pipeline is closed with them, also when Next reaches the
// end (which closes pgx's rows without a Close call).
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.closeBatch()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	r.closeBatch()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) closeBatch() {
	if !r.closed {
		r.closed = true
		r.err = r.br.Close()
	}
}

// oneRow is pgx's QueryRow over batchRows.
type oneRow struct{ rows pgx.Rows }

func (r *oneRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
