//go:build integration

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// The kinds of the inbox's errors against a real server: what the runner
// retries without counting (transient) and what it counts.

// TestInboxTransientErrors, one record per transaction and in a batch:
//   - the effect's connection killed under it (the server ended the
//     session) is transient, and the record applies once afterwards;
//   - a serialization failure still there after Retries is transient;
//   - an effect that outlives its ctx (a handler timeout) is not: it is the
//     record's, and counts against the policy — a poison record whose
//     effect always times out must still be given up;
//   - an error PostgreSQL answered for the effect's statement is not.
func TestInboxTransientErrors(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		batch  int
		queued bool
	}{{1, false}, {4, false}, {1, true}, {4, true}} {
		batch := m.batch
		t.Run(fmt.Sprintf("batch %d queued %v", m.batch, m.queued), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.Retries(2), inbox.Batch(batch))
			inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
			var calls atomic.Int32
			h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
				calls.Add(1)
				switch rec.Offset {
				case 1:
					if calls.Load() == 1 {
						_, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
						return err
					}
				case 2:
					return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
				case 3:
					_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
					return err
				case 4:
					_, err := tx.Exec(ctx, "SELECT 1/0")
					return err
				}
				return inboxEffect("a")(ctx, tx, rec)
			})
			if m.queued {
				h = s.QueuedHandler(func(rec runner.Record, b *pgx.Batch) error {
					calls.Add(1)
					switch rec.Offset {
					case 1:
						if calls.Load() == 1 {
							b.Queue("SELECT pg_terminate_backend(pg_backend_pid())")
							return nil
						}
					case 2:
						b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error {
							return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
						})
						return nil
					case 3:
						b.Queue("SELECT pg_sleep(10)")
						return nil
					case 4:
						b.Queue("SELECT 1/0")
						return nil
					}
					return inboxQueuedEffect("a")(rec, b)
				})
			}
			kind := func(off int64, timeout time.Duration) (error, runner.ErrorKind) {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				err := h(cctx, inboxRec("t", 0, off))
				return err, runner.KindOf(err)
			}

			if err, k := kind(1, time.Minute); err == nil || k != runner.TransientKind {
				t.Fatalf("connection killed under the effect: %v (kind %v), want transient", err, k)
			}
			if err, _ := kind(1, time.Minute); err != nil {
				t.Fatalf("the record after the outage: %v", err)
			}
			calls.Store(0)
			if err, k := kind(2, time.Minute); k != runner.TransientKind || calls.Load() != 2 {
				t.Fatalf("serialization failures past Retries(2): %v (kind %v) after %d attempts, want transient after 2", err, k, calls.Load())
			}
			var pe *pgconn.PgError
			if err, k := kind(3, 300*time.Millisecond); err == nil || k != runner.Retryable {
				t.Fatalf("an effect past its ctx: %v (kind %v), want retryable", err, k)
			}
			if err, k := kind(4, time.Minute); !errors.As(err, &pe) || pe.Code != "22012" || k != runner.Retryable {
				t.Fatalf("division by zero in the effect: %v (kind %v), want the PgError, retryable", err, k)
			}
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 1 {
				t.Fatalf("%d effects, want 1 (record 1)", n)
			}
		})
	}
}

// TestInboxEffectOutlivingTheServersTimeoutIsNotTransient: an effect that
// stays idle in its transaction longer than the server allows
// (idle_in_transaction_session_timeout: a slow call out, for this record
// every time) has its session ended by the server with FATAL 25P03. That
// is the record's failure, as a statement_timeout is (57014, counted):
// marked Transient it would be retried without a count for ever, the
// partition stuck behind a poison record that no policy can give up.
func TestInboxEffectOutlivingTheServersTimeoutIsNotTransient(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 4} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.Batch(batch))
			inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
			h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
				if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = '100ms'"); err != nil {
					return err
				}
				time.Sleep(500 * time.Millisecond) // the slow call out, every attempt
				return inboxEffect("a")(ctx, tx, rec)
			})
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := h(cctx, inboxRec("t", 0, 1))
			if err == nil {
				t.Fatal("the effect outlived idle_in_transaction_session_timeout and succeeded")
			}
			if k := runner.KindOf(err); k == runner.TransientKind {
				t.Fatalf("%v: kind %v; a record whose effect always outlives the server's timeout would be retried uncounted for ever", err, k)
			}
		})
	}
}
