//go:build integration

package integration_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxBatchOf is records t/partition@from..from+n-1.
func inboxBatchOf(partition int32, from int64, n int) []runner.Record {
	recs := make([]runner.Record, n)
	for i := range recs {
		recs[i] = inboxRec("t", partition, from+int64(i))
	}
	return recs
}

func offsetsOf(recs []runner.Record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.Offset
	}
	return out
}

// TestInboxBatchHandler: one transaction per batch. The effect never sees
// a replay — records applied before (one by one, or by an earlier batch),
// a dedup key seen in the same batch — and is not called when every record
// was applied; an effect that fails leaves nothing of the batch, and the
// batch run again applies each record once.
func TestInboxBatchHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g", inbox.DedupHeader("message-id"))
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	var mu sync.Mutex
	var calls [][]int64
	fail := false
	h := s.BatchHandler(func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
		mu.Lock()
		calls = append(calls, offsetsOf(recs))
		mu.Unlock()
		if err := inboxBatchEffect("a", nil)(ctx, tx, recs); err != nil {
			return err
		}
		if fail {
			return errors.New("the batch failed after its effects")
		}
		return nil
	})
	one := s.Handler(inboxEffect("a"))
	for off := range int64(5) {
		if err := one(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h(ctx, inboxBatchOf(0, 0, 10)); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{5, 6, 7, 8, 9}}; !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("the effect got %v, want %v (the records not applied before)", calls, want)
	}
	calls = nil
	if err := h(ctx, inboxBatchOf(0, 3, 7)); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 0 {
		t.Fatalf("the effect was called with %v for a batch applied before", calls)
	}

	// An effect that fails: nothing of the batch commits.
	fail = true
	batch := inboxBatchOf(0, 10, 6)
	batch[4].Headers = []runner.Header{{Key: "message-id", Value: []byte("m")}}
	batch[5].Headers = []runner.Header{{Key: "message-id", Value: []byte("m")}} // the same event twice
	if err := h(ctx, batch); err == nil || runner.KindOf(err) != runner.Retryable {
		t.Fatalf("a failing batch: %v, want its error, retryable", err)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" >= 10`); n != 0 {
		t.Fatalf("the failed batch left %d inbox rows", n)
	}
	fail = false
	calls = nil
	if err := h(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{10, 11, 12, 13, 14}}; !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("the effect got %v, want %v (15 is a duplicate of 14's key)", calls, want)
	}
	inboxExactlyOnceNoOrder(t, pool, 15)
	if st := s.Stats(); st.Applied != 15 || st.Batches != 3 {
		t.Fatalf("stats %+v, want 15 applied in 3 batches", st)
	}
}

// TestInboxBatchHandlerFencing: a batch whose partition's lease moves on
// while its effect runs is fenced whole (runner.ErrFenced), leaves no row
// and no effect, and the new owner applies the batch once; a batch after
// the bump is fenced before its effect runs.
func TestInboxBatchHandlerFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	tp := runner.TP{Topic: "t", Partition: 0}
	a := inboxStore(t, pool, "g", inbox.Owner("a"))
	b := inboxStore(t, pool, "g", inbox.Owner("b"))
	inboxTake(t, a, tp, -1)
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	ha := a.BatchHandler(func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
		if recs[0].Offset == 0 {
			close(inside)
			<-release
		}
		return inboxBatchEffect("a", nil)(ctx, tx, recs)
	})
	done := make(chan error, 1)
	go func() { done <- ha(ctx, inboxBatchOf(0, 0, 8)) }()
	<-inside
	inboxTake(t, b, tp, -1)
	open()
	err := <-done
	var fe *inbox.FencedError
	if !errors.Is(err, runner.ErrFenced) || !errors.As(err, &fe) {
		t.Fatalf("A's batch after the bump: %v, want a FencedError", err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 0 {
		t.Fatalf("the fenced batch left %d effects", n)
	}
	ran := false
	if err := a.BatchHandler(func(context.Context, pgx.Tx, []runner.Record) error { ran = true; return nil })(ctx, inboxBatchOf(0, 8, 4)); !errors.Is(err, runner.ErrFenced) || ran {
		t.Fatalf("A's next batch: %v (effect ran %v), want fenced before its effect", err, ran)
	}
	if err := b.BatchHandler(inboxBatchEffect("b", nil))(ctx, inboxBatchOf(0, 0, 12)); err != nil {
		t.Fatal(err)
	}
	inboxExactlyOnceNoOrder(t, pool, 12)
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'b'"); n != 12 {
		t.Fatalf("%d of B's effects, want 12", n)
	}
}

// TestInboxBatchHandlerRefuses: a batch of two partitions, and a partition
// the Store holds no lease of.
func TestInboxBatchHandlerRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g")
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	h := s.BatchHandler(inboxBatchEffect("a", nil))
	if err := h(ctx, []runner.Record{inboxRec("t", 0, 1), inboxRec("t", 1, 1)}); err == nil {
		t.Fatal("a batch of two partitions was taken")
	}
	if err := h(ctx, inboxBatchOf(3, 0, 2)); !errors.Is(err, inbox.ErrNoLease) {
		t.Fatalf("a partition without a lease: %v, want ErrNoLease", err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 0 {
		t.Fatalf("%d effects", n)
	}
}

// TestInboxBatchHandlerPanic: a BatchEffect that panics after writing
// part of its effect goes to the runner as a panic, with the transaction
// rolled back (no effect, no inbox row), the connection back in the pool,
// and the batch applied once when it runs again.
func TestInboxBatchHandlerPanic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g")
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	boom := true
	h := s.BatchHandler(func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
		if err := inboxBatchEffect("a", nil)(ctx, tx, recs[:1]); err != nil {
			return err
		}
		if boom {
			panic("the effect panicked")
		}
		return inboxBatchEffect("a", nil)(ctx, tx, recs[1:])
	})
	batch := inboxBatchOf(0, 0, 3)
	func() {
		defer func() {
			if v := recover(); v == nil {
				t.Error("the effect's panic did not reach the caller")
			}
		}()
		_ = h(ctx, batch)
	}()
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects") + inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox"); n != 0 {
		t.Fatalf("%d effects and inbox rows after the panic, want 0", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after the panic", n)
	}
	boom = false
	if err := h(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 3 {
		t.Fatalf("%d effects after the batch ran again, want 3", n)
	}
}
