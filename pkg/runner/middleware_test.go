package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

var timeoutRec = runner.Record{Topic: "orders", Partition: 1, Offset: 9}

// waitForCtx is a handler that returns its ctx's error once ctx is done.
func waitForCtx(ctx context.Context, _ runner.Record) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestTimeoutEndsTheAttempt: the attempt's ctx gets its deadline d after
// the attempt starts, and a handler that returns the deadline's error gets
// a retryable *TimeoutError that says so.
func TestTimeoutEndsTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var deadline time.Time
		h := runner.Timeout(2 * time.Second)(func(ctx context.Context, rec runner.Record) error {
			deadline, _ = ctx.Deadline()
			return waitForCtx(ctx, rec)
		})
		err := h(context.Background(), timeoutRec)
		if took := time.Since(start); took != 2*time.Second {
			t.Fatalf("the attempt took %v, want the 2s timeout", took)
		}
		if !deadline.Equal(start.Add(2 * time.Second)) {
			t.Fatalf("ctx deadline %v, want start + 2s (%v)", deadline, start.Add(2*time.Second))
		}
		var te *runner.TimeoutError
		if !errors.As(err, &te) || te.Record != "orders/1@9" || te.Timeout != 2*time.Second {
			t.Fatalf("%v (%T), want a *runner.TimeoutError for orders/1@9 after 2s", err, err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v does not wrap context.DeadlineExceeded", err)
		}
		if want := "runner: handler for orders/1@9 timed out after 2s: context deadline exceeded"; err.Error() != want {
			t.Fatalf("error %q, want %q", err, want)
		}
		if k := runner.KindOf(err); k != runner.Retryable {
			t.Fatalf("KindOf = %v, want retryable", k)
		}
	})
}

// TestTimeoutLeavesOtherOutcomes: what Timeout returns as it is, and the
// marks it keeps.
func TestTimeoutLeavesOtherOutcomes(t *testing.T) {
	errEarly := errors.New("failed before the deadline")
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		h       runner.Handler
		want    error // errors.Is
		timeout bool  // a *TimeoutError
		kind    runner.ErrorKind
	}{
		{
			name: "failure before the deadline",
			h:    func(context.Context, runner.Record) error { return errEarly },
			want: errEarly,
		},
		{
			name: "success after the deadline",
			h: func(ctx context.Context, _ runner.Record) error {
				time.Sleep(3 * time.Second) // ignores ctx, then succeeds
				return nil
			},
		},
		{
			name: "the runner cancelled ctx first",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(time.Second, cancel)
				return ctx, cancel
			},
			h:    waitForCtx,
			want: context.Canceled,
		},
		{
			name: "an earlier deadline of ctx (HandlerTimeout)",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			},
			h:    waitForCtx,
			want: context.DeadlineExceeded,
		},
		{
			name: "the handler's permanent mark is kept",
			h: func(ctx context.Context, rec runner.Record) error {
				return runner.Permanent(waitForCtx(ctx, rec))
			},
			want: context.DeadlineExceeded, timeout: true, kind: runner.PermanentKind,
		},
		{
			name: "the handler's transient mark is kept",
			h: func(ctx context.Context, rec runner.Record) error {
				return runner.Transient(waitForCtx(ctx, rec))
			},
			want: context.DeadlineExceeded, timeout: true, kind: runner.TransientKind,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				err := runner.Timeout(2*time.Second)(tc.h)(ctx, timeoutRec)
				if tc.want == nil && err != nil || !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				var te *runner.TimeoutError
				if got := errors.As(err, &te); got != tc.timeout {
					t.Fatalf("%v: a *TimeoutError: %v, want %v", err, got, tc.timeout)
				}
				if err != nil && runner.KindOf(err) != tc.kind {
					t.Fatalf("KindOf(%v) = %v, want %v", err, runner.KindOf(err), tc.kind)
				}
			})
		})
	}
}

// TestTimeoutNested: of two Timeouts the one whose deadline ended the
// attempt names itself, the outer one does not claim it.
func TestTimeoutNested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := runner.Chain(waitForCtx, runner.Timeout(5*time.Second), runner.Timeout(time.Second))
		var te *runner.TimeoutError
		err := h(context.Background(), timeoutRec)
		if !errors.As(err, &te) || te.Timeout != time.Second || strings.Count(err.Error(), "timed out") != 1 {
			t.Fatalf("%v, want one *TimeoutError of the inner 1s", err)
		}
	})
}

// TestTimeoutZeroAndNegative: 0 is no timeout; a negative one panics.
func TestTimeoutZeroAndNegative(t *testing.T) {
	runner.Timeout(0)(func(ctx context.Context, _ runner.Record) error {
		if d, ok := ctx.Deadline(); ok {
			t.Fatalf("Timeout(0): ctx has a deadline %v", d)
		}
		return nil
	})(context.Background(), timeoutRec)
	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(string), "Timeout(-1s)") {
			t.Fatalf("Timeout(-1s) recovered %v, want a panic naming it", v)
		}
	}()
	runner.Timeout(-time.Second)
}

// TestTimeoutIsARetriedFailure: through the runner, an attempt past a
// topic's Timeout is a failed attempt that the policy retries; the next
// attempt, which succeeds, completes the record.
func TestTimeoutIsARetriedFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")})
		var attempts atomic.Int32
		var firstErr atomic.Value
		h := func(ctx context.Context, rec runner.Record) error {
			if attempts.Add(1) == 1 {
				return waitForCtx(ctx, rec)
			}
			return nil
		}
		m := newMeter()
		r := newRunner(t, src,
			runner.Handle(topic, runner.Chain(h, func(next runner.Handler) runner.Handler {
				return func(ctx context.Context, rec runner.Record) error {
					err := next(ctx, rec)
					if err != nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return err
				}
			}, runner.Timeout(time.Second))),
			runner.Failure(runner.Skip(3)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(time.Millisecond), runner.MeterProvider(m.provider))
		started(t, r)
		assign(t, src, tp(0))
		await(t, 2*time.Second, "the record completes on its second attempt", committedAt(src, 0, 1))
		if n := attempts.Load(); n != 2 {
			t.Fatalf("%d attempts, want 2", n)
		}
		if f, r, s := m.sum(t, "tidemark.records.failed"), m.sum(t, "tidemark.records.retried"), m.sum(t, "tidemark.records.skipped"); f != 1 || r != 1 || s != 0 {
			t.Fatalf("failed %d, retried %d, skipped %d; want 1, 1, 0", f, r, s)
		}
		var te *runner.TimeoutError
		if err, _ := firstErr.Load().(error); !errors.As(err, &te) {
			t.Fatalf("the first attempt's error %v is not a *TimeoutError", err)
		}
	})
}
