package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/runner"
)

// QueuedEffect is the second shape of a record's effect: instead of running
// its statements one after the other on a transaction (Effect), it queues
// them on b, a fresh pgx.Batch for the record, and returns; the inbox sends
// them. Because nothing waits for one statement's answer before the next is
// sent, the statements of every record of a batch (Batch) go to PostgreSQL
// in one pipeline, with a savepoint before each record: a batch costs about
// three round trips — the claim, the effects, the COMMIT — whatever the
// number of records, and two when no statement has a callback (the COMMIT
// then travels with the effects). One record per transaction costs two.
//
// Queue statements with b.Queue(sql, args...). A callback set on the
// queued statement (QueuedQuery.Exec, Query or QueryRow) runs when its
// result arrives, on the batch leader's goroutine; an error it returns, or
// an error PostgreSQL returns for a statement, fails the record: it is
// rolled back to its savepoint, its inbox row deleted, and the records
// after it are sent again. A statement cannot depend on what an earlier
// one returned — write that in SQL (a CTE: INSERT ... RETURNING feeding the
// next statement) or use an Effect. fn must not call b.BeginTx nor queue
// transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT). Returning an
// error fails the record before anything of it is sent; a panic is
// recovered into the record's error. fn is called only for records the
// inbox claimed (not for replays or fenced ones), on the batch leader's
// goroutine.
type QueuedEffect func(rec runner.Record, b *pgx.Batch) error

// QueuedHandler is Handler for a QueuedEffect: the same claim, fencing,
// replay detection, retries and Batch grouping, with the record's
// statements pipelined (see QueuedEffect).
func (s *Store) QueuedHandler(fn QueuedEffect) runner.Handler {
	if fn == nil {
		return func(ctx context.Context, rec runner.Record) error {
			return errors.New("inbox: QueuedHandler was given a nil QueuedEffect")
		}
	}
	b := newBatcher(s, nil)
	b.queued = fn
	return b.handle
}

// queuedRecord is one claimed record of a queued batch and its statements.
type queuedRecord struct {
	it  *item
	qs  []*pgx.QueuedQuery                // the statements, without callbacks
	fns []func(br pgx.BatchResults) error // their callbacks, nil for none
}

// callQueued runs the QueuedEffect for one record. A panic is recovered
// into the record's error, for the reason call gives with Batch > 1, and
// with Batch 1 too, as QueuedEffect promises (an Effect's panic, by
// contrast, goes to the runner then).
func (b *batcher) callQueued(it *item) (r queuedRecord, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("inbox: effect of %s panicked: %v\n%s", it.rec.String(), v, debug.Stack())
		}
	}()
	q := &pgx.Batch{}
	if err := b.queued(it.rec, q); err != nil {
		return r, err
	}
	r.it = it
	for _, qq := range q.QueuedQueries {
		// The callbacks are kept apart and called here, in order: a
		// pgx.BatchResults closed early would run the rest itself.
		r.qs = append(r.qs, &pgx.QueuedQuery{SQL: qq.SQL, Arguments: qq.Arguments})
		r.fns = append(r.fns, qq.Fn)
	}
	return r, nil
}

// runQueued runs a batch of a QueuedEffect once, like runOnce: it returns
// an error for the batch as a whole (nothing committed), and a record that
// failed has its own err. The round trips: BEGIN and the claim of every
// record; then one pipeline of every claimed record's statements, each
// record behind a SAVEPOINT of its own, with the COMMIT when no statement
// has a callback (else the COMMIT after). A record that fails — a
// statement PostgreSQL refuses (the server then skips the rest of the
// pipeline) or a callback's error — is rolled back to its savepoint (one
// round trip), its inbox row deleted and the records after it sent again
// (one more).
func (b *batcher) runQueued(ctx context.Context, sc *schema, batch []*item, epoch int64) (err error) {
	s := b.s
	live := live(batch)
	if len(live) == 0 {
		return nil
	}
	what := batchName(batch)

	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return connError("claiming "+what, err)
	}
	// A connection left inside a transaction is closed by Release, not
	// pooled; the deferred rollback ends it on every path that did not
	// commit.
	defer c.Release()
	tx, rows, xid, err := s.claim(ctx, c, sc, batch, live, epoch)
	// Not a deferred tx.Rollback: a COMMIT sent in a pipeline ends the
	// transaction without pgx's Tx knowing, and its Rollback would then
	// cost a round trip.
	ended := false
	defer func() {
		if !ended {
			_ = tx.Rollback(ctx)
		}
	}()
	if err != nil {
		return err
	}
	unclaim := func(it *item) *pgx.QueuedQuery {
		return &pgx.QueuedQuery{SQL: sc.sql.unclaim, Arguments: s.unclaimArgs(it)}
	}
	var prelude []*pgx.QueuedQuery // sent before the records: rollbacks and unclaims
	var pending []queuedRecord
	callbacks := false
	for _, it := range live {
		if s.replayed(&rows, it.rec.Offset) {
			it.replay = true
			continue
		}
		if originDecided(it) {
			if it.err != nil {
				prelude = append(prelude, unclaim(it))
			}
			continue
		}
		r, ferr := b.callQueued(it)
		if ferr != nil {
			it.err = fmt.Errorf("inbox: effect of %s: %w", it.rec.String(), ferr)
			prelude = append(prelude, unclaim(it))
			continue
		}
		for _, fn := range r.fns {
			callbacks = callbacks || fn != nil
		}
		pending = append(pending, r)
	}
	// A lone record needs no savepoint: if it fails, the transaction is
	// rolled back whole.
	savepoints := len(pending) > 1
	sp := 0 // the savepoint position of pending[0]

	for {
		// Fresh QueuedQuery values for every pipeline: pgx keeps a
		// statement's description in the one it sent, and a pipeline that
		// failed may have had its statements deallocated since.
		p := &pgx.Batch{}
		for _, q := range prelude {
			p.Queue(q.SQL, q.Arguments...)
		}
		for k, r := range pending {
			if savepoints {
				p.Queue("SAVEPOINT " + savepointNames[sp+k])
			}
			for _, q := range r.qs {
				p.Queue(q.SQL, q.Arguments...)
			}
		}
		withCommit := !callbacks
		if withCommit {
			p.Queue("COMMIT")
		}
		pr := c.SendBatch(ctx, p)
		// lost handles an error that is not a statement's: a serialization
		// failure or deadlock runs the batch again; a broken connection is
		// a COMMIT in doubt when the COMMIT was in the pipeline.
		lost := func(err error) error {
			pr.Close()
			var pe *pgconn.PgError
			if withCommit && !errors.As(err, &pe) {
				ended = true
				for _, r := range pending {
					r.it.applied = true // if it committed, all of them did
				}
				return b.commitFailed(ctx, sc, what, epoch, xid, err, live)
			}
			return b.pipelineError(ctx, what, err)
		}
		failedAt, ferr := -1, error(nil)
		for range prelude {
			if _, err := pr.Exec(); err != nil {
				return lost(err)
			}
		}
		for k, r := range pending {
			if savepoints {
				if _, err := pr.Exec(); err != nil {
					return lost(err)
				}
			}
			for j := range r.qs {
				var err error
				if r.fns[j] != nil {
					err = r.fns[j](pr)
				} else {
					_, err = pr.Exec()
				}
				if err != nil {
					failedAt, ferr = k, err
					break
				}
			}
			if failedAt >= 0 {
				break
			}
			r.it.applied = true
		}
		if failedAt < 0 && withCommit {
			_, cerr := pr.Exec() // COMMIT
			if err := pr.Close(); cerr == nil {
				cerr = err
			}
			ended = true
			if cerr != nil {
				return b.commitFailed(ctx, sc, what, epoch, xid, cerr, live)
			}
			return nil
		}
		if failedAt < 0 {
			if err := pr.Close(); err != nil {
				return b.pipelineError(ctx, what, err)
			}
			break
		}
		if retryable(ferr) || c.Conn().IsClosed() {
			return lost(ferr)
		}
		pr.Close()
		// The record at failedAt failed; those before it stand, those after
		// it were skipped (a statement PostgreSQL refused) or ran (a
		// callback's error) and are rolled back with it: send them again.
		failed := pending[failedAt]
		failed.it.err = fmt.Errorf("inbox: effect of %s: %w", failed.it.rec.String(), ferr)
		for _, r := range pending[failedAt:] {
			r.it.applied = false
		}
		if !savepoints {
			return nil // a lone record: the deferred rollback ends it
		}
		// Over the simple protocol, on its own: after a statement
		// PostgreSQL refused, the transaction is aborted until this
		// rollback, and pgx could not prepare the next pipeline's new
		// statements before it.
		if _, err := c.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepointNames[sp+failedAt]); err != nil {
			return b.pipelineError(ctx, what, err)
		}
		prelude = []*pgx.QueuedQuery{unclaim(failed.it)}
		sp += failedAt + 1
		pending = pending[failedAt+1:]
	}
	ended = true
	if err := tx.Commit(ctx); err != nil {
		return b.commitFailed(ctx, sc, what, epoch, xid, err, live)
	}
	return nil
}

// pipelineError is the batch's error when a pipeline failed other than by a
// record's statement: a serialization failure or deadlock (run again), or
// the connection.
func (b *batcher) pipelineError(ctx context.Context, what string, err error) error {
	var pe *pgconn.PgError
	if retryable(err) || (errors.As(err, &pe) && !sessionEnded(pe)) {
		return err
	}
	return effectError(ctx, "running the batch of "+what, err)
}
