package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/runner"
)

// A COMMIT is in doubt when the client cannot tell whether PostgreSQL
// committed the transaction: the connection broke after the COMMIT was
// sent, or ctx ended while the server was committing (pgx then closes the
// connection), or the server ended the session (FATAL) while it waited for
// a synchronous standby after committing locally. Reporting that as a
// failure is wrong half of the time: under DeadLetter or Skip an applied
// record would be given up. So the Store learns the outcome from another
// connection — pg_xact_status of the transaction's id, which the claim
// returned — and reports a failure only when the transaction rolled back.
// pg_xact_status's word is not enough, though: a transaction id is only
// remembered once the WAL that names it reached the disk, so after a crash
// of the server the ids of transactions lost in the crash are given again,
// and the lost transaction's id may belong to one that committed since.
// The records' inbox rows, written in the same transaction, are what tells
// (see verdict).
//
// pg_xact_status does not wait for a transaction still in progress (a
// COMMIT waiting for a synchronous standby is in progress until the standby
// answers): the Store asks again, for up to InDoubtTimeout, and then
// returns an *InDoubtError, which the runner retries whatever its policy.
// The record stays in doubt in the Store (not claimed again, which would
// wait on the in-doubt transaction's row lock) until an attempt learns the
// outcome.

// InDoubtError is returned by a Store's handler when a record's COMMIT
// was sent but its answer lost, and PostgreSQL could not say within
// InDoubtTimeout whether the transaction committed (it is still in
// progress, or the server cannot be reached). It unwraps to
// runner.ErrOutcomeUnknown — the runner retries the record whatever its
// failure policy, never dead-letters or skips it — and to the error the
// COMMIT got. The next attempt asks again before doing anything else:
// committed, the record is done; rolled back, it is applied again.
type InDoubtError struct {
	Record string // topic/partition@offset
	// XID is the transaction's id (pg_current_xact_id), for
	// pg_xact_status.
	XID   int64
	Cause error
}

func (e *InDoubtError) Error() string {
	return fmt.Sprintf("inbox: %s: COMMIT of transaction %d in doubt: its answer was lost (%v) and PostgreSQL did not say whether it committed",
		e.Record, e.XID, e.Cause)
}

// Unwrap returns runner.ErrOutcomeUnknown and the COMMIT's error.
func (e *InDoubtError) Unwrap() []error { return []error{runner.ErrOutcomeUnknown, e.Cause} }

// inDoubt reports whether a COMMIT that failed with err may have committed:
// anything but an error PostgreSQL answered the COMMIT with (severity
// ERROR: the transaction rolled back) or pgx's report that the transaction
// had already failed. pgconn.SafeToRetry is no proof that the COMMIT was
// not sent: when the connection breaks while pgx waits for the answer,
// pgx v5.12 reports "conn closed", which it marks safe to retry.
func inDoubt(err error) bool {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe):
		return pe.Severity != "ERROR" // FATAL or PANIC: the session ended, maybe after committing
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return false
	}
	return true
}

// xactOutcome is what pg_xact_status says of a transaction.
type xactOutcome uint8

const (
	xactUnknown   xactOutcome = iota // in progress, or the server did not answer
	xactCommitted                    // committed
	xactAborted                      // rolled back (also by a crash)
)

// endedGrace is how long outcome goes on asking once ctx has ended: the
// cancel request pgx sent when ctx ended is what ends a COMMIT's wait for a
// synchronous standby (PostgreSQL keeps the local commit), and the server
// takes a moment to act on it. One ask at once would often find the
// transaction still in progress and leave the record in doubt.
const endedGrace = time.Second

// outcome asks pg_xact_status for xid until it says committed or aborted,
// for up to InDoubtTimeout while ctx lasts, and for up to endedGrace (within
// InDoubtTimeout) once it has ended (that is why the COMMIT failed, often),
// under a context of its own.
func (s *Store) outcome(ctx context.Context, sc *schema, xid int64) xactOutcome {
	deadline := time.Now().Add(s.cfg.inDoubtTimeout)
	ended := false
	wait := 20 * time.Millisecond
	for {
		if !ended && ctx.Err() != nil {
			ended = true
			deadline = minTime(deadline, time.Now().Add(endedGrace))
		}
		qctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		var status *string
		err := s.pool.QueryRow(qctx, sc.sql.xactStatus, xid).Scan(&status)
		cancel()
		switch {
		case err != nil:
			s.log.Debug("inbox: asking for an in-doubt commit's outcome failed", "xid", xid, "err", err)
		case status == nil:
			// Older than the server's commit log horizon: it cannot be
			// our transaction of moments ago; say unknown, never guess.
			return xactUnknown
		case *status == "committed":
			return xactCommitted
		case *status == "aborted":
			return xactAborted
		}
		if time.Until(deadline) < wait {
			return xactUnknown
		}
		if ended {
			time.Sleep(wait)
		} else if !sleep(ctx, wait) {
			continue // ctx ended while waiting: the grace starts now
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// verdict is what became of the transaction xid that claimed recs: it
// waits for the transaction to end (outcome), then asks for the records'
// inbox rows. They exist, the records are applied, whatever
// pg_xact_status said (with "aborted", a newer owner applied them); one is
// missing, the transaction did not commit — with "committed", that was
// another transaction given the same id after a crash (see above). Missing
// rows of a transaction that did commit (retention pruned them meanwhile,
// or a newer owner's rows) make it say rolled back, which is safe: the
// next attempt finds the records applied and skips them. No records (none
// of the transaction's was applied): pg_xact_status's word.
func (s *Store) verdict(ctx context.Context, sc *schema, xid int64, recs []*runner.Record) xactOutcome {
	o := s.outcome(ctx, sc, xid)
	if o == xactUnknown || len(recs) == 0 {
		return o
	}
	topics := make([]string, len(recs))
	parts := make([]int32, len(recs))
	offs := make([]int64, len(recs))
	for i, r := range recs {
		topics[i], parts[i], offs[i] = r.Topic, r.Partition, r.Offset
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.inDoubtTimeout)
	defer cancel()
	var n int
	if err := s.pool.QueryRow(qctx, sc.sql.rows, s.group, topics, parts, offs).Scan(&n); err != nil {
		s.log.Debug("inbox: asking for an in-doubt commit's rows failed", "xid", xid, "err", err)
		return xactUnknown
	}
	switch {
	case n == len(recs):
		return xactCommitted
	case o == xactCommitted:
		s.log.Warn("inbox: pg_xact_status says an in-doubt transaction committed, but its inbox rows are missing: "+
			"its id was given again after a crash of the server; the transaction rolled back",
			"records", recs[0].String(), "xid", xid, "rows", n, "want", len(recs))
	}
	return xactAborted
}

// doubts are the records of a Store whose last COMMIT is in doubt, with
// their transaction's id. Entries are removed when an attempt learns the
// outcome; a record whose partition went to another member may keep its
// entry, which costs a few bytes.
type doubts struct {
	n  atomic.Int64 // len(m), read without the lock: every record asks
	mu sync.Mutex
	m  map[doubtKey]int64
}

type doubtKey struct {
	tp     runner.TP
	offset int64
}

func (d *doubts) add(rec *runner.Record, xid int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[doubtKey]int64{}
	}
	d.m[doubtKey{rec.TP(), rec.Offset}] = xid
	d.n.Store(int64(len(d.m)))
}

func (d *doubts) get(rec *runner.Record) (int64, bool) {
	if d.n.Load() == 0 {
		return 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	xid, ok := d.m[doubtKey{rec.TP(), rec.Offset}]
	return xid, ok
}

func (d *doubts) remove(rec *runner.Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, doubtKey{rec.TP(), rec.Offset})
	d.n.Store(int64(len(d.m)))
}

// settled resolves a record left in doubt by an earlier attempt before a
// new one starts: done reports that the earlier attempt committed (the
// record is applied: count it and return nil), err that the outcome is
// still unknown. Neither means it rolled back, or was never in doubt: go
// on and apply it.
func (s *Store) settled(ctx context.Context, rec *runner.Record) (done bool, err error) {
	xid, ok := s.doubts.get(rec)
	if !ok {
		return false, nil
	}
	sc, err := s.resolve(ctx)
	if err != nil {
		return false, err
	}
	switch s.verdict(ctx, sc, xid, []*runner.Record{rec}) {
	case xactCommitted:
		s.doubts.remove(rec)
		s.countApplied(ctx, rec.Topic, 1)
		return true, nil
	case xactAborted:
		s.doubts.remove(rec)
		return false, nil
	}
	return false, &InDoubtError{Record: rec.String(), XID: xid, Cause: errors.New("still in doubt from an earlier attempt")}
}

// resolveCommit settles a COMMIT that failed with an in-doubt error:
// committed is nil (applied), rolled back an ordinary error (the runner's
// policy applies: nothing was applied), unknown an *InDoubtError, and the
// records are remembered in doubt.
func (s *Store) resolveCommit(ctx context.Context, sc *schema, what string, xid int64, cause error, recs []*runner.Record) (applied bool, err error) {
	switch s.verdict(ctx, sc, xid, recs) {
	case xactCommitted:
		s.log.Info("inbox: a COMMIT's answer was lost; the transaction committed", "records", what, "xid", xid, "cause", cause)
		return true, nil
	case xactAborted:
		// Rolled back because ctx ended (the handler timeout passed while
		// the effects ran): the records', not the database's (effectError).
		return false, effectError(ctx, "committing "+what+" (its answer was lost; the transaction rolled back)", cause)
	}
	for _, rec := range recs {
		s.doubts.add(rec, xid)
	}
	s.log.Warn("inbox: a COMMIT is in doubt; the runner retries the records until the outcome is known", "records", what, "xid", xid, "cause", cause)
	return false, &InDoubtError{Record: what, XID: xid, Cause: cause}
}
