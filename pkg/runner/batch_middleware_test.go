package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

var timeoutBatch = []runner.Record{
	{Topic: "orders", Partition: 1, Offset: 9},
	{Topic: "orders", Partition: 1, Offset: 10},
	{Topic: "orders", Partition: 1, Offset: 12},
}

// TestChainBatchOrder: ChainBatch runs the first middleware outermost.
func TestChainBatchOrder(t *testing.T) {
	var calls []string
	mw := func(name string) runner.BatchMiddleware {
		return func(next runner.BatchHandler) runner.BatchHandler {
			return func(ctx context.Context, recs []runner.Record) error {
				calls = append(calls, name)
				return next(ctx, recs)
			}
		}
	}
	h := runner.ChainBatch(func(context.Context, []runner.Record) error { calls = append(calls, "h"); return nil }, mw("a"), mw("b"))
	if err := h(context.Background(), timeoutBatch); err != nil || !slices.Equal(calls, []string{"a", "b", "h"}) {
		t.Fatalf("calls %v, err %v; want [a b h], nil", calls, err)
	}
}

// TestBatchTimeoutEndsTheAttempt: a batch attempt gets its deadline, and
// one that returns the deadline's error is a *TimeoutError naming the
// batch; a *BatchError inside it keeps its meaning.
func TestBatchTimeoutEndsTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h := runner.BatchTimeout(2 * time.Second)(func(ctx context.Context, recs []runner.Record) error {
			<-ctx.Done()
			return &runner.BatchError{Index: 1, Err: ctx.Err()}
		})
		err := h(context.Background(), timeoutBatch)
		if took := time.Since(start); took != 2*time.Second {
			t.Fatalf("the attempt took %v, want the 2s timeout", took)
		}
		var te *runner.TimeoutError
		if !errors.As(err, &te) || te.Record != "orders/1@9-12" || te.Timeout != 2*time.Second {
			t.Fatalf("%v (%T), want a *runner.TimeoutError for orders/1@9-12 after 2s", err, err)
		}
		var be *runner.BatchError
		if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v: want the *BatchError at 1 and context.DeadlineExceeded inside", err)
		}
		ok := runner.BatchTimeout(time.Second)(func(context.Context, []runner.Record) error { return nil })
		if err := ok(context.Background(), timeoutBatch); err != nil {
			t.Fatalf("a batch within its timeout: %v", err)
		}
	})
	if h := runner.BatchTimeout(0)(nil); h != nil {
		t.Errorf("BatchTimeout(0) wrapped the handler; want it returned as it is")
	}
	defer func() {
		if recover() == nil {
			t.Errorf("BatchTimeout(-1s) did not panic")
		}
	}()
	runner.BatchTimeout(-time.Second)
}

// TestLogBatchFailures: a failed batch attempt is logged at warn with the
// batch, its size, the record a *BatchError names, the attempt and the
// kind; a success logs nothing.
func TestLogBatchFailures(t *testing.T) {
	c := &logCapture{}
	fail := true
	h := runner.LogBatchFailures(slog.New(c))(func(context.Context, []runner.Record) error {
		if fail {
			return &runner.BatchError{Index: 2, Err: runner.Permanent(errors.New("bad row"))}
		}
		return nil
	})
	ctx := runner.AttemptContextForTest(context.Background(), 2)
	if err := h(ctx, timeoutBatch); err == nil {
		t.Fatal("the handler's error was dropped")
	}
	fail = false
	if err := h(ctx, timeoutBatch); err != nil {
		t.Fatal(err)
	}
	recs := c.records()
	if len(recs) != 1 || recs[0].Level != slog.LevelWarn {
		t.Fatalf("%d log records (%v), want one at warn", len(recs), recs)
	}
	got := attrs(recs[0])
	want := map[string]string{"batch": "orders/1@9-12", "records": "3", "failed_record": "orders/1@12", "attempt": "2", "kind": "permanent"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attr %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
