package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// BatchEffect applies the business effect of a batch of records of one
// partition with tx, the transaction that also holds their inbox rows. recs
// are the batch's records that were not applied before, in the batch's
// order: replays (rows that exist, dedup keys already seen, redriven dead
// letters whose origin was applied) are taken out first. Like an Effect it
// must do all its database work through tx and must not commit or roll it
// back; returning an error rolls back the effects and the inbox rows of
// the whole batch.
type BatchEffect func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error

// BatchHandler returns the runner.BatchHandler (register it with the
// runner's HandleBatch, and the Store's AssignHook with runner.OnAssign)
// that applies fn exactly once per record, one transaction per batch:
//
//  1. BEGIN and one claim of every record's inbox row at the lease epoch
//     this Store took for the partition, in one round trip, as Handler's
//     claim; a lease at another epoch is a FencedError for the batch;
//  2. the records whose row already existed (or whose DedupKey, or
//     redriven origin, was seen) are replays and taken out; if none is
//     left, fn is not called;
//  3. fn once with the others, then COMMIT, where the fence checks every
//     row as for Handler.
//
// So the batch commits whole or not at all: an error from fn rolls back
// every record's effect and row and goes to the runner's failure policy
// for the batch. A serialization failure or deadlock runs the batch again
// (Retries); a lease moved on is a *FencedError (runner.ErrFenced), for
// which Owners works as for Handler; the database unreachable an
// *UnavailableError (runner.Transient); a COMMIT in doubt is settled as
// for Handler, and an *InDoubtError when it cannot be. A panic in fn goes
// to the runner with the transaction rolled back. The Batch and BatchWait
// options do not apply: the runner forms the batch, and a batch has no
// size limit of the inbox's (it has no savepoints).
//
// A redriven dead letter whose origin is below its partition's applied
// mark with no row left (see OriginBelowMarkError) cannot be decided, and
// one whose origin headers are malformed (ErrBadOrigin) cannot be read: the
// other records of its batch are applied and committed, and the handler
// returns those records' errors (runner.Permanent), so the runner's
// policy gives the batch up — its applied records are replays if they
// are ever redriven, the undecidable one is dead-lettered again.
//
// recs must be records of one partition (the runner's batches are); a
// batch that is not is refused.
func (s *Store) BatchHandler(fn BatchEffect) runner.BatchHandler {
	if fn == nil {
		return func(ctx context.Context, recs []runner.Record) error {
			return errors.New("inbox: BatchHandler was given a nil BatchEffect")
		}
	}
	b := newBatcher(s, nil)
	b.batchFn = fn
	return b.handleBatch
}

func (b *batcher) handleBatch(ctx context.Context, recs []runner.Record) error {
	if len(recs) == 0 {
		return nil
	}
	s := b.s
	tp := recs[0].TP()
	for i := range recs {
		if recs[i].TP() != tp {
			return fmt.Errorf("inbox: a batch holds records of %s and %s; a BatchHandler's batch must be of one partition", tp, recs[i].TP())
		}
	}
	// The lease, as handle takes it.
	l, ok := s.lease(tp)
	switch {
	case s.cfg.share && recs[0].DeliveryCount < 1:
		return fmt.Errorf("%w (record %s)", ErrNotShared, recs[0].String())
	case !ok && s.cfg.share:
		sc, err := s.resolve(ctx)
		if err != nil {
			return err
		}
		if l, err = s.shareLease(ctx, sc, tp); err != nil {
			return err
		}
	case !ok && recs[0].DeliveryCount > 0:
		return fmt.Errorf("%w (record %s comes from a share group: make the Store with inbox.ShareGroup() instead)", ErrNoLease, recs[0].String())
	case !ok:
		return fmt.Errorf("%w (record %s)", ErrNoLease, recs[0].String())
	}
	batch := make([]*item, 0, len(recs))
	// Records whose origin headers are malformed are left out, as an
	// undecidable origin is: the others apply, the batch's error is theirs.
	var refused []error
	for i := range recs {
		rec := recs[i]
		// A record whose last COMMIT is in doubt: done (applied) is left
		// out, still unknown fails the batch.
		done, err := s.settled(ctx, &rec)
		if err != nil {
			return err
		}
		if done {
			continue
		}
		or, err := originOf(&rec)
		if err != nil {
			refused = append(refused, err)
			continue
		}
		batch = append(batch, &item{ctx: ctx, rec: rec, key: s.dedupKey(&rec), origin: or})
	}
	if len(batch) == 0 {
		return errors.Join(refused...)
	}
	b.run(ctx, batch, l)
	// A failure of the transaction is every record's error; otherwise only
	// undecidable origins have one.
	below := refused
	for _, it := range batch {
		var ob *OriginBelowMarkError
		switch {
		case it.err == nil:
		case errors.As(it.err, &ob):
			below = append(below, it.err)
		default:
			return it.err
		}
	}
	return errors.Join(below...)
}

// runBatch runs a BatchHandler's batch once: claim, fn with the records
// claimed, COMMIT. Like runOnce it returns an error for the batch as a
// whole (nothing committed) and sets each record's err, applied and
// replay.
func (b *batcher) runBatch(ctx context.Context, sc *schema, batch []*item, epoch int64) error {
	s := b.s
	live := live(batch)
	if len(live) == 0 {
		return nil
	}
	tx, rows, xid, err := s.claim(ctx, s.pool, sc, batch, live, epoch)
	// After Commit a no-op; on every other path it ends the transaction
	// (also when fn panics).
	defer tx.Rollback(ctx) //nolint:errcheck
	if err != nil {
		return err
	}
	fresh := make([]*item, 0, len(live))
	for _, it := range live {
		if s.replayed(&rows, it.rec.Offset) {
			it.replay = true
			continue
		}
		if originDecided(it) {
			if it.err != nil {
				if _, err := tx.Exec(ctx, sc.sql.unclaim, s.unclaimArgs(it)...); err != nil {
					if retryable(err) {
						return err
					}
					return effectError(ctx, "rolling back "+it.rec.String(), err)
				}
			}
			continue
		}
		fresh = append(fresh, it)
	}
	if len(fresh) > 0 {
		recs := make([]runner.Record, len(fresh))
		for i, it := range fresh {
			recs[i] = it.rec
		}
		if ferr := b.batchFn(ctx, tx, recs); ferr != nil {
			switch {
			case retryable(ferr):
				return ferr
			case tx.Conn().IsClosed():
				return effectError(ctx, "running the batch effect of "+batchName(batch), ferr)
			}
			return fmt.Errorf("inbox: batch effect of %s (%d records): %w", batchName(batch), len(recs), ferr)
		}
		for _, it := range fresh {
			it.applied = true
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return b.commitFailed(ctx, sc, batchName(batch), epoch, xid, err, live)
	}
	return nil
}
