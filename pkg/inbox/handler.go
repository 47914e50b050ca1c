package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Effect applies one record's business effect with tx, the transaction that
// also holds the record's inbox row. It must do all its database work
// through tx and must not commit or roll it back; returning an error rolls
// back the effect and the inbox row together. Anything else it does — an
// HTTP call, a message sent — is outside the transaction: it is not rolled
// back and may happen again when the record is replayed.
//
// ctx is the runner's handler context (with Batch, the batch's; see
// Handler).
type Effect func(ctx context.Context, tx pgx.Tx, rec runner.Record) error

// Handler returns the runner.Handler that applies fn exactly once per
// record (register it with runner.Handle, and the Store's AssignHook with
// runner.OnAssign). Per record it
//
//  1. begins a transaction and, in the same round trip, inserts the
//     record's inbox row — if the partition's lease is still at the epoch
//     this Store took — with ON CONFLICT DO NOTHING. A lease at another
//     epoch is a FencedError; a row that already exists (or a DedupKey
//     already seen) is a replay: the transaction is rolled back, the replay
//     counted, and the handler returns nil without calling fn;
//  2. calls fn with the transaction;
//  3. commits. At commit the fence trigger checks the lease again and holds
//     it FOR SHARE until the commit is done, so a lease bump that happened
//     while fn ran makes the commit fail with a FencedError, and a bump that
//     comes later waits for the commit.
//
// A FencedError wraps runner.ErrFenced: the runner neither completes nor
// retries the record. A serialization failure or deadlock runs the whole
// transaction again, up to Retries times with a short jittered backoff;
// any other error (fn's, wrapped with the record's name, or the
// database's) goes back to the runner's failure policy. An fn that panics
// leaves its transaction rolled back and the panic to the runner.
//
// With Batch(n) > 1, records of the same partition in flight at once share
// a transaction, each in its own savepoint (see Batch): fn runs on the
// goroutine of whichever record leads the batch, its ctx is cancelled only
// when every record of the batch has given up, and a panic in fn is
// recovered and reported as that record's error, so it cannot strand the
// other records. If the leading goroutine unwinds in another way — a panic
// outside fn (a tracer, a meter provider, a logger) or runtime.Goexit in fn
// (t.FailNow), which recover does not stop — the panic goes on to the
// runner as the leader's record's error, and every other record of its
// batch returns an error, so the runner's failure policy runs it again (a
// replay if the batch had committed). A record whose own ctx ends while it
// waits returns ctx.Err(); if its effect was already in the batch it
// commits, and the replay finds the row.
func (s *Store) Handler(fn Effect) runner.Handler {
	if fn == nil {
		return func(ctx context.Context, rec runner.Record) error {
			return errors.New("inbox: Handler was given a nil Effect")
		}
	}
	if s.cfg.batch > 1 {
		b := newBatcher(s, fn)
		return b.handle
	}
	return s.oneByOne(func(ctx context.Context, sc *schema, rec *runner.Record, epoch int64, key *string) error {
		return s.applyOne(ctx, sc, fn, rec, epoch, key)
	})
}

// oneByOne is the handler of one record per transaction around apply,
// which runs the record's transaction once: the lease, the schema, a
// COMMIT left in doubt by an earlier attempt, the retries of serialization
// failures and deadlocks, and a lease taken back (Owners).
func (s *Store) oneByOne(apply func(ctx context.Context, sc *schema, rec *runner.Record, epoch int64, key *string) error) runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		l, ok := s.lease(rec.TP())
		if !ok {
			return fmt.Errorf("%w (record %s)", ErrNoLease, rec.String())
		}
		sc, err := s.resolve(ctx)
		if err != nil {
			return err
		}
		if done, err := s.settled(ctx, &rec); done || err != nil {
			return err
		}
		key := s.dedupKey(&rec)
		for retakes := 0; ; retakes++ {
			err := s.retry(ctx, func() error { return apply(ctx, sc, &rec, l.epoch, key) })
			var fe *FencedError
			if retakes == maxRetakes || !errors.As(err, &fe) {
				return err
			}
			epoch, won, rerr := s.retake(ctx, sc, rec.TP(), l, fe.Current)
			if rerr != nil {
				return rerr
			}
			if !won {
				return err
			}
			l.epoch = epoch
		}
	}
}

// maxRetakes bounds how often one handler call takes its lease back (see
// Owners) before it gives up with the FencedError: a lease that keeps
// moving means the group is rebalancing, and the next assignment decides.
const maxRetakes = 3

// dedupKey returns the record's business key, nil when it has none.
func (s *Store) dedupKey(rec *runner.Record) *string {
	if s.cfg.dedup == nil {
		return nil
	}
	k, ok := s.cfg.dedup(rec)
	if !ok {
		return nil
	}
	return &k
}

// keyDigest is what the inbox stores of a dedup key: its SHA-256, so that a
// key can be any bytes of any length; nil (NULL) for no key.
func keyDigest(key *string) []byte {
	if key == nil {
		return nil
	}
	d := sha256.Sum256([]byte(*key))
	return d[:]
}

// retry runs attempt until it returns something other than a serialization
// failure or deadlock, at most Retries times.
func (s *Store) retry(ctx context.Context, attempt func() error) error {
	for i := 1; ; i++ {
		err := attempt()
		if err == nil || !retryable(err) || i >= s.cfg.retries {
			return err
		}
		s.countRetry(ctx)
		s.log.Debug("inbox transaction retried", "attempt", i, "err", err)
		if !sleep(ctx, retryBackoff(i)) {
			return ctx.Err()
		}
	}
}

// retryBackoff is the wait before attempt i+1: 10ms doubling per attempt up
// to 1s, with full jitter in [d/2, d], so the transactions that collided do
// not collide again in step.
func retryBackoff(attempt int) time.Duration {
	d := 10 * time.Millisecond
	for i := 1; i < attempt && d < time.Second; i++ {
		d *= 2
	}
	d = min(d, time.Second)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// applyOne runs one record's transaction.
func (s *Store) applyOne(ctx context.Context, sc *schema, fn Effect, rec *runner.Record, epoch int64, key *string) error {
	b := &pgx.Batch{}
	b.BeginTx(s.cfg.txOptions)
	b.Queue(sc.sql.claim, s.group, rec.Topic, rec.Partition, rec.Offset, epoch, keyDigest(key))
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	// After Commit this is a no-op; on every other path it ends the
	// transaction and gives the connection back (also when fn panics).
	defer tx.Rollback(ctx) //nolint:errcheck
	var (
		current *int64
		claimed bool
		xid     int64
	)
	_, err := br.Exec() // BEGIN
	if err == nil {
		err = br.QueryRow().Scan(&current, &claimed, &xid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if retryable(err) {
			return err
		}
		return connError("claiming "+rec.String(), err)
	}
	switch {
	case current == nil || *current != epoch:
		s.countFenced(ctx)
		return &FencedError{Record: rec.String(), Epoch: epoch, Current: deref(current)}
	case !claimed:
		s.countReplays(ctx, 1)
		return nil
	}
	if err := fn(ctx, tx, *rec); err != nil {
		if retryable(err) {
			return err
		}
		return fmt.Errorf("inbox: effect of %s: %w", rec.String(), err)
	}
	if err := tx.Commit(ctx); err != nil {
		if isCode(err, belowMarkCode) {
			// Retention pruned the record's row while this transaction
			// claimed it again: a replay, rolled back.
			s.countReplays(ctx, 1)
			return nil
		}
		if inDoubt(err) {
			if applied, err := s.resolveCommit(ctx, sc, rec.String(), xid, err, []*runner.Record{rec}); !applied {
				return err
			}
			s.countApplied(ctx, 1)
			return nil
		}
		err = s.commitError(ctx, rec.String(), epoch, err)
		if fencedByTrigger(err) {
			s.countFenced(ctx)
		}
		return err
	}
	s.countApplied(ctx, 1)
	return nil
}

// commitError classifies a failed COMMIT.
func (s *Store) commitError(ctx context.Context, what string, epoch int64, err error) error {
	switch {
	case fencedByTrigger(err): // counted by the caller
		return &FencedError{Record: what, Epoch: epoch, Cause: err}
	case isCode(err, belowMarkCode):
		// Only a batch can get here (applyOne takes it as a replay): run
		// the batch again, and its claim finds the record below the mark.
		return err
	case retryable(err):
		return err
	case errors.Is(err, pgx.ErrTxCommitRollback):
		// The transaction was already aborted by a failed statement that fn
		// did not return (or recovered from without a savepoint).
		return fmt.Errorf("inbox: %s: the transaction was aborted by a statement of the effect that failed; the effect must return database errors: %w", what, err)
	}
	return connError("committing "+what, err)
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
