package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// letters records every dead letter with the topic it was written to.
type letters struct {
	mu     sync.Mutex
	topics []string
	recs   []runner.Record
}

func (l *letters) WriteDeadLetter(_ context.Context, topic string, rec runner.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.topics = append(l.topics, topic)
	l.recs = append(l.recs, rec)
	return nil
}

func (l *letters) got() ([]string, []runner.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.topics...), append([]runner.Record(nil), l.recs...)
}

// TestErrorKinds: a Permanent error is dead-lettered after its first
// attempt, a Transient one is retried past the policy's attempts without
// being dead-lettered, a Retryable one is dead-lettered after the policy's
// attempts; the handler sees its attempt number each time.
func TestErrorKinds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		fail     func(n int, err error) error // the nth call's error
		failures int                          // the handler fails this many times, then succeeds
		attempts int                          // the handler is called this many times
		dead     bool
		kind     string
	}{
		{"permanent", func(_ int, err error) error { return runner.Permanent(err) }, 100, 1, true, "permanent"},
		{"permanent wrapped", func(_ int, err error) error { return fmt.Errorf("order 7: %w", runner.Permanent(err)) }, 100, 1, true, "permanent"},
		{"transient", func(_ int, err error) error { return runner.Transient(err) }, 12, 13, false, ""},
		{"retryable", func(_ int, err error) error { return err }, 100, 3, true, "retryable"},
		// Transient attempts leave the policy's count whole for the
		// retryable ones that follow: 5 + 3 attempts.
		{"transient then retryable", func(n int, err error) error {
			if n <= 5 {
				return runner.Transient(err)
			}
			return err
		}, 100, 8, true, "retryable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := runnertest.New()
				src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("k")})
				dl := &letters{}
				var mu sync.Mutex
				var seen []int
				r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
					mu.Lock()
					defer mu.Unlock()
					seen = append(seen, runner.Attempt(ctx))
					if len(seen) <= tc.failures {
						return tc.fail(len(seen), errPoison)
					}
					return nil
				}), runner.Failure(runner.DeadLetter("t.dlt", 3, dl)), runner.Backoff(time.Millisecond, 2*time.Millisecond),
					runner.CommitInterval(2*time.Millisecond))
				started(t, r)
				assign(t, src, tp(0))
				await(t, time.Minute, "record finished", committedAt(src, 0, 1))
				mu.Lock()
				defer mu.Unlock()
				want := make([]int, tc.attempts)
				for i := range want {
					want[i] = i + 1
				}
				if fmt.Sprint(seen) != fmt.Sprint(want) {
					t.Fatalf("handler saw attempts %v, want %v", seen, want)
				}
				_, recs := dl.got()
				if !tc.dead {
					if len(recs) != 0 {
						t.Fatalf("a %s error was dead-lettered", tc.name)
					}
					return
				}
				if len(recs) != 1 {
					t.Fatalf("%d dead letters, want 1", len(recs))
				}
				if k, _ := recs[0].Header(runner.HeaderErrorKind); string(k) != tc.kind {
					t.Fatalf("%s = %q, want %q", runner.HeaderErrorKind, k, tc.kind)
				}
			})
		})
	}
}

// TestOutcomeUnknownOutlivesPermanent: an error that is both Permanent and
// ErrOutcomeUnknown is retried, never dead-lettered: it may have been
// applied.
func TestOutcomeUnknownOutlivesPermanent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		dl := &letters{}
		var calls atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if calls.Add(1) < 5 {
				return runner.Permanent(fmt.Errorf("commit lost: %w", runner.ErrOutcomeUnknown))
			}
			return nil
		}), runner.Failure(runner.DeadLetter("t.dlt", 1, dl)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "record finished", committedAt(src, 0, 1))
		if _, recs := dl.got(); len(recs) != 0 || calls.Load() != 5 {
			t.Fatalf("%d dead letters after %d calls, want 0 after 5", len(recs), calls.Load())
		}
	})
}

// TestClassifier: the runner-wide classifier decides the kind, a topic's
// own replaces it, and a classifier that panics counts the error as
// retryable instead of crashing the worker.
func TestClassifier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(
			runner.Record{Topic: "a", Partition: 0, Offset: 0},
			runner.Record{Topic: "b", Partition: 0, Offset: 0},
			runner.Record{Topic: "c", Partition: 0, Offset: 0},
		)
		dl := &letters{}
		calls := map[string]*atomic.Int32{"a": {}, "b": {}, "c": {}}
		h := func(ctx context.Context, rec runner.Record) error {
			calls[rec.Topic].Add(1)
			return errPoison
		}
		r := newRunner(t, src,
			runner.Handle("a", h),
			runner.Handle("b", h, runner.WithClassifier(func(error) runner.ErrorKind { return runner.Retryable })),
			runner.Handle("c", h, runner.WithClassifier(func(error) runner.ErrorKind { panic("classifier bug") })),
			runner.Classify(func(err error) runner.ErrorKind {
				if errors.Is(err, errPoison) {
					return runner.PermanentKind
				}
				return runner.KindOf(err)
			}),
			runner.Failure(runner.DeadLetter("dlt", 4, dl)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, runner.TP{Topic: "a"}, runner.TP{Topic: "b"}, runner.TP{Topic: "c"})
		await(t, time.Second, "three dead letters", func() bool { _, recs := dl.got(); return len(recs) == 3 })
		for topic, want := range map[string]int32{"a": 1, "b": 4, "c": 4} {
			if n := calls[topic].Load(); n != want {
				t.Errorf("topic %s: %d attempts, want %d", topic, n, want)
			}
		}
	})
}

// TestPerTopicOptions: each topic's policy, dead-letter topic, timeout and
// backoff apply to its records alone; a topic without options runs with the
// runner-wide ones.
func TestPerTopicOptions(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		for _, topic := range []string{"orders", "payments", "audit", "plain"} {
			src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0})
		}
		dl := &letters{}
		var mu sync.Mutex
		at := map[string][]time.Time{}
		slowErr := map[string]error{}
		h := func(ctx context.Context, rec runner.Record) error {
			mu.Lock()
			at[rec.Topic] = append(at[rec.Topic], time.Now())
			mu.Unlock()
			if rec.Topic == "audit" {
				<-ctx.Done() // runs until its timeout
				mu.Lock()
				slowErr[rec.Topic] = ctx.Err()
				mu.Unlock()
				return ctx.Err()
			}
			return errPoison
		}
		m := newMeter()
		r := newRunner(t, src,
			runner.Handle("orders", h, runner.WithPolicy(runner.DeadLetter("orders.dlt", 2, dl)), runner.WithBackoff(time.Second, time.Second)),
			runner.Handle("payments", h, runner.WithPolicy(runner.Skip(3))),
			runner.Handle("audit", h, runner.WithPolicy(runner.DeadLetter("audit.dlt", 1, dl)), runner.WithTimeout(5*time.Second)),
			runner.Handle("plain", h),
			runner.Failure(runner.DeadLetter("all.dlt", 5, dl)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.MeterProvider(m.provider), runner.Logger(discard()))
		started(t, r)
		var tps []runner.TP
		for _, topic := range []string{"orders", "payments", "audit", "plain"} {
			tps = append(tps, runner.TP{Topic: topic})
		}
		assign(t, src, tps...)
		await(t, time.Minute, "every record finished", func() bool {
			for _, tp := range tps {
				if o, ok := src.Committed(tp); !ok || o != 1 {
					return false
				}
			}
			return true
		})
		topics, recs := dl.got()
		for i, rec := range recs {
			if topics[i] != "audit.dlt" {
				continue
			}
			// WithTimeout's deadline says it ended the attempt.
			if msg, _ := rec.Header(runner.HeaderError); !strings.Contains(string(msg), "runner: handler for audit/0@0 timed out after 5s") {
				t.Errorf("audit's dead letter: %s = %q, want the *runner.TimeoutError's message", runner.HeaderError, msg)
			}
		}
		slices.Sort(topics)
		if got := strings.Join(topics, ","); got != "all.dlt,audit.dlt,orders.dlt" {
			t.Fatalf("dead letters went to %s, want all.dlt,audit.dlt,orders.dlt", got)
		}
		if n := m.sum(t, "tidemark.records.skipped"); n != 1 {
			t.Fatalf("%d records skipped, want payments' one", n)
		}
		mu.Lock()
		defer mu.Unlock()
		for topic, n := range map[string]int{"orders": 2, "payments": 3, "audit": 1, "plain": 5} {
			if len(at[topic]) != n {
				t.Errorf("topic %s: %d attempts, want %d", topic, len(at[topic]), n)
			}
		}
		if gap := at["orders"][1].Sub(at["orders"][0]); gap < 500*time.Millisecond {
			t.Errorf("orders retried after %v, want its own backoff of 1s (jittered down to at least 500ms)", gap)
		}
		if gap := at["plain"][1].Sub(at["plain"][0]); gap > time.Millisecond {
			t.Errorf("plain retried after %v, want the runner-wide backoff of 1ms", gap)
		}
		if !errors.Is(slowErr["audit"], context.DeadlineExceeded) {
			t.Errorf("audit's handler ctx ended with %v, want its 5s timeout", slowErr["audit"])
		}
	})
}

// TestDeadLetterHeaders: a dead letter keeps the record's key, value and
// headers and adds every documented header with its value; dead-lettered
// again after a redrive, it keeps its first origin and carries one set of
// failure headers, the new ones.
func TestDeadLetterHeaders(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		ts := time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)
		redriven := []runner.Header{
			{Key: "trace", Value: []byte("x")},
			{Key: runner.HeaderOriginTopic, Value: []byte("first")},
			{Key: runner.HeaderOriginPartition, Value: []byte("9")},
			{Key: runner.HeaderOriginOffset, Value: []byte("99")},
			{Key: runner.HeaderError, Value: []byte("old error")},
			{Key: runner.HeaderAttempts, Value: []byte("5")},
		}
		src.Append(
			runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("key\xff"), Value: []byte("v0"), Timestamp: ts,
				Headers: []runner.Header{{Key: "trace", Value: []byte("x")}}},
			runner.Record{Topic: topic, Partition: 0, Offset: 1, Value: []byte("v1"), Timestamp: ts, Headers: redriven},
		)
		dl := &letters{}
		start := time.Now()
		r := newRunner(t, groupedSource{src}, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			return fmt.Errorf("order %d: %w", rec.Offset, errPoison)
		}), runner.Failure(runner.DeadLetter("t.dlt", 2, dl)), runner.Backoff(time.Second, time.Second),
			runner.CommitInterval(2*time.Millisecond), runner.Logger(discard()))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Minute, "both dead-lettered", committedAt(src, 0, 2))
		_, recs := dl.got()
		if len(recs) != 2 {
			t.Fatalf("%d dead letters, want 2", len(recs))
		}
		slices.SortFunc(recs, func(a, b runner.Record) int { return int(a.Offset - b.Offset) })
		first, second := recs[0], recs[1]
		if string(first.Key) != "key\xff" || string(first.Value) != "v0" {
			t.Fatalf("dead letter key %q value %q, want the record's", first.Key, first.Value)
		}
		if first.Headers[0].Key != "trace" {
			t.Fatalf("the record's own header is not first: %v", first.Headers)
		}
		failedAt := func(rec runner.Record, h string) time.Time {
			v, _ := rec.Header(h)
			tm, err := time.Parse(time.RFC3339Nano, string(v))
			if err != nil {
				t.Fatalf("%s = %q: %v", h, v, err)
			}
			return tm
		}
		want := map[string]string{
			runner.HeaderOriginTopic:     topic,
			runner.HeaderOriginPartition: "0",
			runner.HeaderOriginOffset:    "0",
			runner.HeaderOriginTimestamp: "2026-03-04T05:06:07.000000008Z",
			runner.HeaderOriginKey:       "key\xff",
			runner.HeaderGroup:           group,
			runner.HeaderErrorType:       "*errors.errorString", // under fmt.Errorf's wrapping
			runner.HeaderError:           "order 0: poison",
			runner.HeaderErrorKind:       "retryable",
			runner.HeaderAttempts:        "2",
		}
		for h, v := range want {
			if got, ok := first.Header(h); !ok || string(got) != v {
				t.Errorf("%s = %q (present %v), want %q", h, got, ok, v)
			}
		}
		f, l := failedAt(first, runner.HeaderFirstFailure), failedAt(first, runner.HeaderLastFailure)
		if f.Before(start) || l.Sub(f) < 500*time.Millisecond {
			t.Errorf("first failure %v, last %v: want the two attempts a backoff (1s, jittered) apart, after %v", f, l, start)
		}
		// The redriven record keeps its first origin, and its old failure
		// headers are replaced by this failure's.
		count := map[string]int{}
		for _, h := range second.Headers {
			count[h.Key]++
		}
		for h, v := range map[string]string{runner.HeaderOriginTopic: "first", runner.HeaderOriginPartition: "9",
			runner.HeaderOriginOffset: "99", runner.HeaderError: "order 1: poison", runner.HeaderAttempts: "2"} {
			if got, _ := second.Header(h); string(got) != v || count[h] != 1 {
				t.Errorf("redriven dead letter: %s = %q (%d times), want %q once", h, got, count[h], v)
			}
		}
		if _, ok := second.Header(runner.HeaderOriginTimestamp); ok {
			t.Errorf("redriven dead letter got a new origin timestamp: the first origin's identity must not be mixed")
		}
	})
}

// TestHandleOptionErrors: a topic's invalid option is named with its topic.
func TestHandleOptionErrors(t *testing.T) {
	h := func(context.Context, runner.Record) error { return nil }
	for _, tc := range []struct {
		opt  runner.HandleOption
		want string
	}{
		{runner.WithPolicy(runner.DeadLetter("", 3, &letters{})), `option Handle("t").WithPolicy: DeadLetter needs a topic`},
		{runner.WithPolicy(runner.DeadLetter("t", 3, &letters{})), `option Handle("t").WithPolicy: dead-letter topic "t" is also consumed`},
		{runner.WithPolicy(runner.Skip(0)), `option Handle("t").WithPolicy: attempts 0 is not positive`},
		{runner.WithBackoff(time.Second, time.Millisecond), `option Handle("t").WithBackoff: need 0 < initial <= max`},
		{runner.WithTimeout(-time.Second), `option Handle("t").WithTimeout: -1s is negative`},
		{runner.WithPolicy(runner.DeadLetter("t.dlt", 3, nil)), `option Handle("t").WithPolicy: DeadLetter has no writer`},
	} {
		_, err := runner.New(runnertest.New(), runner.Handle(topic, h, tc.opt))
		var ce *runner.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v, want a *ConfigError containing %q", err, tc.want)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
