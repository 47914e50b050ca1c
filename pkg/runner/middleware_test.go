package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"sync"
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
// topic's Timeout is a failed attempt that the policy retries, and that
// LogFailures logs with its attempt number; the next attempt, which
// succeeds, completes the record.
func TestTimeoutIsARetriedFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")})
		var attempts atomic.Int32
		h := func(ctx context.Context, rec runner.Record) error {
			if attempts.Add(1) == 1 {
				return waitForCtx(ctx, rec)
			}
			return nil
		}
		c := &logCapture{}
		m := newMeter()
		r := newRunner(t, src,
			runner.Handle(topic, runner.Chain(h, runner.LogFailures(slog.New(c)), runner.Timeout(time.Second))),
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
		recs := c.records()
		if len(recs) != 1 {
			t.Fatalf("%d log records, want 1 for the attempt that timed out", len(recs))
		}
		got := attrs(recs[0])
		if got["attempt"] != "1" || got["kind"] != "retryable" || !strings.Contains(got["err"], "t/0@0 timed out after 1s") {
			t.Fatalf("logged %v, want attempt 1, retryable, the timeout", got)
		}
	})
}

// logCapture is a slog.Handler that keeps every record, at every level.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

func (c *logCapture) records() []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]slog.Record(nil), c.recs...)
}

func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

// TestLogFailuresLogsEachFailedAttempt: one warn line per failed attempt
// with the record, the attempt, the kind and the error.
func TestLogFailuresLogsEachFailedAttempt(t *testing.T) {
	base := errors.New("db down")
	for _, tc := range []struct {
		err  error
		kind string
	}{
		{base, "retryable"},
		{runner.Transient(base), "transient"},
		{runner.Permanent(base), "permanent"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := &logCapture{}
			h := runner.LogFailures(slog.New(c))(func(context.Context, runner.Record) error { return tc.err })
			ctx := runner.AttemptContextForTest(context.Background(), 3)
			if err := h(ctx, timeoutRec); err != tc.err {
				t.Fatalf("h = %v, want the handler's error as it is", err)
			}
			recs := c.records()
			if len(recs) != 1 || recs[0].Level != slog.LevelWarn {
				t.Fatalf("%d log records (%v), want one at warn", len(recs), recs)
			}
			got := attrs(recs[0])
			want := map[string]string{"record": "orders/1@9", "attempt": "3", "kind": tc.kind, "err": tc.err.Error()}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("attr %s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

// TestLogFailuresFenced: a fence is logged at warn as one, with no kind:
// the policy does not classify it.
func TestLogFailuresFenced(t *testing.T) {
	c := &logCapture{}
	fenced := fmt.Errorf("inbox: lease moved: %w", runner.ErrFenced)
	if err := runner.LogFailures(slog.New(c))(func(context.Context, runner.Record) error { return fenced })(context.Background(), timeoutRec); err != fenced {
		t.Fatalf("h = %v, want the handler's error as it is", err)
	}
	recs := c.records()
	if len(recs) != 1 || recs[0].Level != slog.LevelWarn || !strings.Contains(recs[0].Message, "fenced") {
		t.Fatalf("log records %v, want one fence at warn", recs)
	}
	if got := attrs(recs[0]); got["record"] != "orders/1@9" || got["kind"] != "" {
		t.Fatalf("attrs %v, want the record and no kind", got)
	}
}

// TestLogFailuresQuiet: nothing at warn for a success, for an attempt the
// runner cancelled (debug only), or for a panic, which goes on to the
// runner unrecovered.
func TestLogFailuresQuiet(t *testing.T) {
	c := &logCapture{}
	mw := runner.LogFailures(slog.New(c))
	if err := mw(func(context.Context, runner.Record) error { return nil })(context.Background(), timeoutRec); err != nil {
		t.Fatal(err)
	}
	if n := len(c.records()); n != 0 {
		t.Fatalf("%d log records for a success, want none", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the partition was lost
	if err := mw(waitForCtx)(ctx, timeoutRec); !errors.Is(err, context.Canceled) {
		t.Fatalf("h = %v, want context.Canceled", err)
	}
	if recs := c.records(); len(recs) != 1 || recs[0].Level != slog.LevelDebug || attrs(recs[0])["record"] != "orders/1@9" {
		t.Fatalf("log records %v, want one at debug naming the record", recs)
	}

	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the handler's panic to pass through", v)
			}
		}()
		mw(func(context.Context, runner.Record) error { panic("boom") })(context.Background(), timeoutRec)
	}()
	if n := len(c.records()); n != 1 {
		t.Fatalf("%d log records after the panic, want still 1: the runner logs panics", n)
	}
}

// TestLogFailuresTimeout: an attempt past a deadline is a failure, logged
// at warn, with Timeout's error; no key or value is logged.
func TestLogFailuresTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		h := runner.Chain(waitForCtx, runner.LogFailures(slog.New(slog.NewTextHandler(&buf, nil))), runner.Timeout(time.Second))
		rec := timeoutRec
		rec.Key, rec.Value = []byte("key-secret"), []byte("value-secret")
		_ = h(context.Background(), rec)
		line := buf.String()
		for _, want := range []string{"level=WARN", "record=orders/1@9", "attempt=0", "kind=retryable", "timed out after 1s"} {
			if !strings.Contains(line, want) {
				t.Errorf("log %q does not say %q", line, want)
			}
		}
		if strings.Contains(line, "secret") {
			t.Errorf("log %q shows the key or the value", line)
		}
	})
}

// TestLogFailuresNilLogger: nil is slog.Default() as it is when
// LogFailures is called.
func TestLogFailuresNilLogger(t *testing.T) {
	c := &logCapture{}
	// slog.SetDefault with a handler of its own also points the log
	// package's output at that handler (and clears its flags), and setting
	// the previous default back does not undo that: every later line of
	// slog.Default() would reach c and stay in it for the rest of the
	// binary. Restore all three.
	prev, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(c))
	mw := runner.LogFailures(nil)
	slog.SetDefault(prev)
	log.SetOutput(out)
	log.SetFlags(flags)
	_ = mw(func(context.Context, runner.Record) error { return errors.New("x") })(context.Background(), timeoutRec)
	if n := len(c.records()); n != 1 {
		t.Fatalf("%d records in the default logger of the call, want 1", n)
	}
}
