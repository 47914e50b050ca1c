package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

var errPoison = errors.New("poison")

// TestBlockHoldsCommitBelowPoison checks invariant 9 with Block: the poison
// record is retried, the commit stays just below it, other keys go on.
func TestBlockHoldsCommitBelowPoison(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 100, 10) // key of offset i is k(i%10)
		var attempts atomic.Int32
		var healed atomic.Bool
		var mu sync.Mutex
		handledKeys := map[string]int{}
		h := func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 42 && !healed.Load() {
				attempts.Add(1)
				return errPoison
			}
			mu.Lock()
			handledKeys[string(rec.Key)]++
			mu.Unlock()
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Backoff(time.Millisecond, 4*time.Millisecond),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit held at the poison record", committedAt(src, 0, 42))
		if n := attempts.Load(); n < 5 {
			t.Fatalf("offset 42 tried %d times in a second, want at least 5", n)
		}
		// Every other key finished all its records; k2 stopped at offset 42.
		mu.Lock()
		for k := range 10 {
			key := "k" + string(rune('0'+k))
			want := 10
			if k == 2 {
				want = 4 // 2, 12, 22, 32 before 42
			}
			if handledKeys[key] != want {
				t.Errorf("key %s handled %d times, want %d", key, handledKeys[key], want)
			}
		}
		mu.Unlock()
		if t.Failed() {
			t.FailNow()
		}
		healed.Store(true)
		await(t, time.Second, "commit reaches the end once the record succeeds", committedAt(src, 0, 100))
	})
}

// dlq is a dead-letter writer that blocks until allowed, then records.
type dlq struct {
	allow chan struct{}
	mu    sync.Mutex
	got   []runner.Record
	fails int
}

func (d *dlq) WriteDeadLetter(ctx context.Context, topic string, rec runner.Record) error {
	select {
	case <-d.allow:
	case <-ctx.Done():
		return ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fails > 0 {
		d.fails--
		return errors.New("dlq unavailable")
	}
	d.got = append(d.got, rec)
	return nil
}

// TestDeadLetterCommitsOnlyAfterWrite: the commit passes the poison record
// only once its dead-letter write was acknowledged, and the dead-letter
// record carries the origin and the error.
func TestDeadLetterCommitsOnlyAfterWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(
			runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")},
			runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte("b"), Value: []byte("bad"), Headers: []runner.Header{{Key: "h", Value: []byte("1")}}},
			runner.Record{Topic: topic, Partition: 0, Offset: 2, Key: []byte("c")},
		)
		d := &dlq{allow: make(chan struct{}), fails: 2}
		m := newMeter()
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 1 {
				panic("boom") // a panic is a failed attempt, not a crash
			}
			return nil
		}), runner.Failure(runner.DeadLetter("t.dlq", 3, d)), runner.Backoff(time.Millisecond, 2*time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.MeterProvider(m.provider))
		started(t, r)
		assign(t, src, tp(0))
		// A second of fake time: the three attempts, then the dead-letter
		// write waiting, over hundreds of commit intervals.
		await(t, time.Second, "commit held below the record being dead-lettered", committedAt(src, 0, 1))
		if n := m.sum(t, "tidemark.records.failed"); n != 3 {
			t.Fatalf("tidemark.records.failed = %d, want 3 failed attempts", n)
		}
		close(d.allow) // the first two writes fail, the third is acknowledged
		await(t, time.Second, "commit passes after the write", committedAt(src, 0, 3))
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.got) != 1 {
			t.Fatalf("%d dead-letter records, want 1", len(d.got))
		}
		got := d.got[0]
		want := map[string]string{
			"h": "1", "tidemark-attempts": "3", "tidemark-origin-topic": topic,
			"tidemark-origin-partition": "0", "tidemark-origin-offset": "1",
		}
		for k, v := range want {
			if hv, ok := got.Header(k); !ok || string(hv) != v {
				t.Errorf("dead-letter header %s = %q, want %q", k, hv, v)
			}
		}
		if e, _ := got.Header("tidemark-error"); !strings.Contains(string(e), "panicked") || !strings.Contains(string(e), "boom") {
			t.Errorf("tidemark-error = %q, want the panic", e)
		}
		if string(got.Value) != "bad" || string(got.Key) != "b" {
			t.Errorf("dead-letter record key/value = %q/%q", got.Key, got.Value)
		}
		if n := m.sum(t, "tidemark.records.dead_lettered"); n != 1 {
			t.Errorf("dead_lettered counter = %d, want 1", n)
		}
	})
}

// TestSkipIsCountedAndMovesOn: Skip completes the record after the attempts.
func TestSkipIsCountedAndMovesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 10, 10)
		m := newMeter()
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 4 {
				return errPoison
			}
			return nil
		}), runner.Failure(runner.Skip(2)), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond), runner.MeterProvider(m.provider))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit at the end", committedAt(src, 0, 10))
		if n := m.sum(t, "tidemark.records.skipped"); n != 1 {
			t.Fatalf("skipped = %d, want 1", n)
		}
		if n := m.sum(t, "tidemark.records.failed"); n != 2 {
			t.Fatalf("failed attempts = %d, want 2", n)
		}
	})
}

// TestHandlerTimeoutIsAFailedAttempt: an attempt past HandlerTimeout is
// cancelled and retried.
func TestHandlerTimeoutIsAFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, 3, 3)
		var calls atomic.Int32
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 1 && calls.Add(1) == 1 {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}), runner.HandlerTimeout(20*time.Millisecond), runner.Backoff(time.Millisecond, time.Millisecond),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit at the end", committedAt(src, 0, 3))
		if n := calls.Load(); n != 2 {
			t.Fatalf("offset 1 ran %d times, want 2 (timed out once)", n)
		}
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	h := runner.Handle(topic, func(context.Context, runner.Record) error { return nil })
	cases := []struct {
		name   string
		opts   []runner.Option
		option string
	}{
		{"no handler", nil, "Handle"},
		{"nil handler", []runner.Option{runner.Handle("x", nil)}, "Handle"},
		{"twice", []runner.Option{h, h}, "Handle"},
		{"concurrency", []runner.Option{h, runner.Concurrency(0)}, "Concurrency"},
		{"water marks", []runner.Option{h, runner.WaterMarks(10, 10)}, "WaterMarks"},
		{"byte water marks", []runner.Option{h, runner.ByteWaterMarks(10, 20)}, "ByteWaterMarks"},
		{"byte cap", []runner.Option{h, runner.ByteWaterMarks(100, 10), runner.MaxBufferedBytes(50)}, "MaxBufferedBytes"},
		{"commit interval", []runner.Option{h, runner.CommitInterval(0)}, "CommitInterval"},
		{"drain budget", []runner.Option{h, runner.DrainBudget(-1)}, "DrainBudget"},
		{"backoff", []runner.Option{h, runner.Backoff(time.Second, time.Millisecond)}, "Backoff"},
		{"zero backoff", []runner.Option{h, runner.Backoff(0, time.Millisecond)}, "Backoff"},
		{"skip attempts", []runner.Option{h, runner.Failure(runner.Skip(0))}, "Failure"},
		{"dlq topic", []runner.Option{h, runner.Failure(runner.DeadLetter("", 3, &dlq{}))}, "Failure"},
		{"dlq writer", []runner.Option{h, runner.Failure(runner.DeadLetter("d", 3, nil))}, "Failure"},
		{"order", []runner.Option{h, runner.Order(runner.Ordering(9))}, "Order"},
		{"logger", []runner.Option{h, runner.Logger(nil)}, "Logger"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runner.New(runnertest.New(), tc.opts...)
			var ce *runner.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option {
				t.Fatalf("New = %v, want a ConfigError naming %s", err, tc.option)
			}
		})
	}
	if _, err := runner.New(nil, h); err == nil {
		t.Fatal("New(nil source) succeeded")
	}
}

// TestPanicsOutsideTheHandlerAreRecovered: a panic in the assign hook's
// Applied filter or in the DeadLetterWriter is a failed attempt (or a
// failed write), retried like a handler's; it does not crash the process.
// (Both used to run outside the recover and took the process down.)
func TestPanicsOutsideTheHandlerAreRecovered(t *testing.T) {
	t.Run("Applied", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := runnertest.New()
			fill(src, 1, 3, 3)
			var calls atomic.Int32
			var ran atomic.Int32
			r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
				ran.Add(1)
				return nil
			}), runner.OnAssign(runner.PerPartition(func(context.Context, runner.Assignment) (runner.Applied, error) {
				return func(off int64) bool {
					if off == 1 && calls.Add(1) == 1 {
						panic("filter bug")
					}
					return false
				}, nil
			})), runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(time.Millisecond))
			started(t, r)
			assign(t, src, tp(0))
			time.Sleep(time.Second)
			synctest.Wait()
			if off, _ := src.Committed(tp(0)); off != 3 || ran.Load() != 3 || calls.Load() != 2 {
				t.Fatalf("committed %d, handler ran %d times, filter called %d times for offset 1; want 3, 3 and 2 (one panic, retried)", off, ran.Load(), calls.Load())
			}
		})
	})
	t.Run("DeadLetterWriter", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := runnertest.New()
			fill(src, 1, 3, 3)
			w := &panicOnceWriter{}
			r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
				if rec.Offset == 1 {
					return errPoison
				}
				return nil
			}), runner.Failure(runner.DeadLetter("t.dlq", 1, w)), runner.Backoff(time.Millisecond, time.Millisecond),
				runner.CommitInterval(time.Millisecond))
			started(t, r)
			assign(t, src, tp(0))
			time.Sleep(time.Second)
			synctest.Wait()
			if off, _ := src.Committed(tp(0)); off != 3 || w.writes.Load() != 2 {
				t.Fatalf("committed %d after %d dead-letter writes; want 3 after 2 (one panic, retried)", off, w.writes.Load())
			}
		})
	})
}

// panicOnceWriter is a DeadLetterWriter whose first write panics.
type panicOnceWriter struct{ writes atomic.Int32 }

func (w *panicOnceWriter) WriteDeadLetter(context.Context, string, runner.Record) error {
	if w.writes.Add(1) == 1 {
		panic("writer bug")
	}
	return nil
}
