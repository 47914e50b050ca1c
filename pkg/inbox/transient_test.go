package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestUnreachableIsTransient: a handler that cannot reach PostgreSQL
// returns an error the runner classifies as transient (retried without
// counting against the failure policy), so a database restart does not
// dead-letter good records; it still says PostgreSQL cannot be used, and
// it is not read as fenced.
func TestUnreachableIsTransient(t *testing.T) {
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			// Schema: no lookup of the search_path first; the claim is the
			// first call that needs the server.
			s, err := inbox.New(nowhere(t), "g", inbox.Schema("s"), inbox.Batch(batch))
			if err != nil {
				t.Fatal(err)
			}
			tp := runner.TP{Topic: "t", Partition: 0}
			inbox.SetEpoch(s, tp, 1)
			ran := false
			h := s.Handler(func(context.Context, pgx.Tx, runner.Record) error { ran = true; return nil })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = h(ctx, runner.Record{Topic: "t", Partition: 0, Offset: 3})
			var te *runner.TransientError
			if err == nil || ran || runner.KindOf(err) != runner.TransientKind || !errors.As(err, &te) {
				t.Fatalf("got %v (kind %v, effect ran %v), want an error marked runner.Transient", err, runner.KindOf(err), ran)
			}
			if errors.Is(err, runner.ErrFenced) {
				t.Fatalf("%v reads as fenced", err)
			}
		})
	}
}

// TestConnErrorKinds: an error PostgreSQL answered stays retryable (the
// runner's policy counts it); one that never reached it is transient, and
// unwraps to pgx's error.
func TestConnErrorKinds(t *testing.T) {
	pgErr := &pgconn.PgError{Code: "23505", Message: "duplicate key"}
	if err := inbox.ConnError("claiming t/0@1", pgErr); runner.KindOf(err) != runner.Retryable || !errors.Is(err, pgErr) {
		t.Fatalf("%v: kind %v, want retryable wrapping the PgError", err, runner.KindOf(err))
	}
	cause := errors.New("dial tcp: connection refused")
	err := inbox.ConnError("claiming t/0@1", cause)
	var ue *inbox.UnavailableError
	if runner.KindOf(err) != runner.TransientKind || !errors.Is(err, cause) || !errors.As(err, &ue) {
		t.Fatalf("%v: kind %v, want transient wrapping the cause", err, runner.KindOf(err))
	}
	if want := "inbox: claiming t/0@1: cannot use PostgreSQL: dial tcp: connection refused"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

// TestBatchHandlerUnreachableIsTransient: the BatchHandler's errors are
// classified the same way.
func TestBatchHandlerUnreachableIsTransient(t *testing.T) {
	s, err := inbox.New(nowhere(t), "g", inbox.Schema("s"))
	if err != nil {
		t.Fatal(err)
	}
	inbox.SetEpoch(s, runner.TP{Topic: "t"}, 1)
	ran := false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = s.BatchHandler(func(context.Context, pgx.Tx, []runner.Record) error { ran = true; return nil })(ctx,
		[]runner.Record{{Topic: "t", Offset: 1}, {Topic: "t", Offset: 2}})
	if err == nil || ran || runner.KindOf(err) != runner.TransientKind {
		t.Fatalf("got %v (kind %v, effect ran %v), want transient", err, runner.KindOf(err), ran)
	}
}

// TestConnErrorTransactionTimeouts: the server ends a session whose
// transaction stayed idle past idle_in_transaction_session_timeout (FATAL
// 25P03) or ran past transaction_timeout (FATAL 25P04). That is the
// transaction's doing, as a statement_timeout (57014) is: retryable, counted
// by the runner's policy. Transient, a record whose effect always outlives
// the timeout would be retried without a count for ever.
func TestConnErrorTransactionTimeouts(t *testing.T) {
	for _, code := range []string{"25P03", "25P04"} {
		pgErr := &pgconn.PgError{Severity: "FATAL", Code: code, Message: "terminating connection due to idle-in-transaction timeout"}
		if err := inbox.ConnError("committing t/0@1", pgErr); runner.KindOf(err) != runner.Retryable || !errors.Is(err, pgErr) {
			t.Errorf("%s: %v: kind %v, want retryable wrapping the PgError", code, err, runner.KindOf(err))
		}
	}
	// A session ended by a shutdown stays transient.
	if err := inbox.ConnError("committing t/0@1", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}); runner.KindOf(err) != runner.TransientKind {
		t.Errorf("57P01: kind %v, want transient", runner.KindOf(err))
	}
}
