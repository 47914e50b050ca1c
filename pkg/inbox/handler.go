package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/internal/backoff"
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
// transaction again, up to Retries times with a short jittered backoff
// (then it is marked runner.Transient); a database that cannot be used is
// an *UnavailableError (runner.Transient: retried without counting); any
// other error (fn's, wrapped with the record's name, or one PostgreSQL
// answered) goes back to the runner's failure policy.
//
// A redriven dead letter — a record with the runner's origin headers — is
// also a replay when its origin record was applied (or redriven before),
// and otherwise records its origin with its own row, so that the next
// redrive is a replay (see docs/inbox.md, "Redrive"; OriginBelowMarkError
// for an origin retention pruned). An fn that panics
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
	// One record per transaction is a batch of one (see batcher): the
	// claim, the COMMIT and its doubts are written once, for both.
	return newBatcher(s, fn).handle
}

// replayed reports whether a record at off of a batch whose claim
// inserted rows is a replay: its row was not among them (and it takes off
// out of rows). Without replay protection — UnsafeNoReplayProtection, a
// test hook of tidemark_unsafe builds — nothing is a replay and every
// record's effect runs; in any other build unsafeBuild is the constant
// false and this is rows.take.
func (s *Store) replayed(rows *claimed, off int64) bool {
	return !rows.take(off) && s.replayProtected()
}

// replayProtected is false only for a Store given UnsafeNoReplayProtection
// in a tidemark_unsafe build.
func (s *Store) replayProtected() bool { return !(unsafeBuild && s.cfg.noReplayProtection) }

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
// failure or deadlock, at most Retries times, counting each retry for
// topic.
func (s *Store) retry(ctx context.Context, topic string, attempt func() error) error {
	for i := 1; ; i++ {
		err := attempt()
		if err != nil && retryable(err) && i >= s.cfg.retries && !isCode(err, belowMarkCode) {
			// Contention, not the record: the runner retries it later
			// without counting the attempt.
			return runner.Transient(fmt.Errorf("inbox: still a serialization failure or deadlock after %d attempts: %w", i, err))
		}
		if err == nil || !retryable(err) || i >= s.cfg.retries {
			return err
		}
		s.countRetry(ctx, topic)
		s.log.Debug("inbox transaction retried", "attempt", i, "err", err)
		if !sleep(ctx, retryBackoff(i)) {
			return ctx.Err()
		}
	}
}

// retryBackoff is the wait before attempt i+1: 10ms doubling per attempt up
// to 1s, with equal jitter (uniform in [d/2, d]), so the transactions that
// collided do not collide again in step.
func retryBackoff(attempt int) time.Duration {
	return backoff.Jittered(10*time.Millisecond, time.Second, attempt)
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

// commitError classifies a failed COMMIT.
func (s *Store) commitError(ctx context.Context, what string, epoch int64, err error) error {
	switch {
	case fencedByTrigger(err): // counted by the caller
		return &FencedError{Record: what, Epoch: epoch, Cause: err}
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
