package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// batchCall is one call of a batch handler: the offsets it got and its
// Attempt(ctx).
type batchCall struct {
	offsets []int64
	attempt int
}

// batchLog records a batch handler's calls.
type batchLog struct {
	mu    sync.Mutex
	calls []batchCall
}

func (l *batchLog) add(ctx context.Context, recs []runner.Record) {
	c := batchCall{attempt: runner.Attempt(ctx)}
	for _, r := range recs {
		c.offsets = append(c.offsets, r.Offset)
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

func (l *batchLog) get() []batchCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// appendN appends n records of partition 0 at offsets from..from+n-1, with
// an "h" header each.
func appendN(src *runnertest.Source, from, n int) {
	for i := range n {
		off := int64(from + i)
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: off, Key: []byte("k" + strconv.FormatInt(off%2, 10)),
			Value: []byte("v"), Headers: []runner.Header{{Key: "h", Value: []byte(strconv.FormatInt(off, 10))}}})
	}
}

func callsEqual(a, b []batchCall) bool {
	return slices.EqualFunc(a, b, func(x, y batchCall) bool { return x.attempt == y.attempt && slices.Equal(x.offsets, y.offsets) })
}

// TestBatchErrorRetriesFromTheFailedRecord: a *BatchError completes the
// records before its index and the batch is retried from it, with
// Attempt(ctx) counting the attempts of that record.
func TestBatchErrorRetriesFromTheFailedRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 6)
		var log batchLog
		fails := 0
		h := func(ctx context.Context, recs []runner.Record) error {
			log.add(ctx, recs)
			for i, r := range recs {
				if r.Offset == 2 && fails < 2 {
					fails++
					return &runner.BatchError{Index: i, Err: errPoison}
				}
			}
			return nil
		}
		m := newMeter()
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.BatchSize(10)), runner.Order(runner.PartitionOrder),
			runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond), runner.MeterProvider(m.provider))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed past the batch", committedAt(src, 0, 6))
		want := []batchCall{{[]int64{0, 1, 2, 3, 4, 5}, 1}, {[]int64{2, 3, 4, 5}, 2}, {[]int64{2, 3, 4, 5}, 3}}
		if got := log.get(); !callsEqual(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		// Two failed attempts of the one record the BatchError named: the
		// records after it did not fail.
		if n := m.sum(t, "tidemark.records.failed"); n != 2 {
			t.Fatalf("tidemark.records.failed = %d, want 2 (offset 2, twice)", n)
		}
	})
}

// TestBatchDeadLettersEachRecord: a plain error fails the whole batch; at
// the policy's end every record of it is dead-lettered with its own
// headers, and the commit passes them only then.
func TestBatchDeadLettersEachRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 3)
		var log batchLog
		d := &dlq{allow: make(chan struct{})}
		close(d.allow)
		h := func(ctx context.Context, recs []runner.Record) error {
			log.add(ctx, recs)
			return errPoison
		}
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 2, d))),
			runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed past the dead letters", committedAt(src, 0, 3))
		want := []batchCall{{[]int64{0, 1, 2}, 1}, {[]int64{0, 1, 2}, 2}}
		if got := log.get(); !callsEqual(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.got) != 3 {
			t.Fatalf("%d dead letters, want the batch's 3", len(d.got))
		}
		for i, dl := range d.got {
			off := strconv.Itoa(i)
			for k, v := range map[string]string{
				"h": off, runner.HeaderOriginOffset: off, runner.HeaderOriginTopic: topic, runner.HeaderOriginPartition: "0",
				runner.HeaderOriginKey: "k" + strconv.Itoa(i%2), runner.HeaderAttempts: "2", runner.HeaderErrorKind: "retryable",
				runner.HeaderError: errPoison.Error(),
			} {
				if hv, ok := dl.Header(k); !ok || string(hv) != v {
					t.Errorf("dead letter %d: header %s = %q, want %q", i, k, hv, v)
				}
			}
			first, _ := dl.Header(runner.HeaderFirstFailure)
			last, _ := dl.Header(runner.HeaderLastFailure)
			f, ferr := time.Parse(time.RFC3339Nano, string(first))
			l, lerr := time.Parse(time.RFC3339Nano, string(last))
			if ferr != nil || lerr != nil || !f.Before(l) {
				t.Errorf("dead letter %d: first failure %q, last %q; want two times, the first before", i, first, last)
			}
		}
	})
}

// TestBatchErrorDeadLettersTheNamedRecord: at the policy's end, only the
// record a *BatchError names is dead-lettered; the records after it run
// again, their count from 1.
func TestBatchErrorDeadLettersTheNamedRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 3)
		var log batchLog
		d := &dlq{allow: make(chan struct{})}
		close(d.allow)
		h := func(ctx context.Context, recs []runner.Record) error {
			log.add(ctx, recs)
			for i, r := range recs {
				if r.Offset == 1 {
					return &runner.BatchError{Index: i, Err: errPoison}
				}
			}
			return nil
		}
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 2, d))),
			runner.Order(runner.PartitionOrder), runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed past the batch", committedAt(src, 0, 3))
		want := []batchCall{{[]int64{0, 1, 2}, 1}, {[]int64{1, 2}, 2}, {[]int64{2}, 1}}
		if got := log.get(); !callsEqual(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.got) != 1 || d.got[0].Offset != 1 {
			t.Fatalf("dead letters %v, want offset 1 alone", d.got)
		}
		if a, _ := d.got[0].Header(runner.HeaderAttempts); string(a) != "2" {
			t.Fatalf("attempts header %q, want 2", a)
		}
	})
}

// TestBatchPermanentIsImmediate: a Permanent error goes to the policy's
// end at its first attempt; Skip skips each record of the batch.
func TestBatchPermanentIsImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 4)
		var log batchLog
		m := newMeter()
		h := func(ctx context.Context, recs []runner.Record) error {
			log.add(ctx, recs)
			return runner.Permanent(errPoison)
		}
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.Skip(5))), runner.MeterProvider(m.provider),
			runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed past the skipped batch", committedAt(src, 0, 4))
		if got, want := log.get(), []batchCall{{[]int64{0, 1, 2, 3}, 1}}; !callsEqual(got, want) {
			t.Fatalf("calls %v, want %v: one attempt", got, want)
		}
		if n := m.sum(t, "tidemark.records.skipped"); n != 4 {
			t.Fatalf("tidemark.records.skipped = %d, want 4", n)
		}
	})
}

// TestBatchLostCancelsIt: losing the partition cancels the ctx of its
// batch in flight, and nothing of it is committed.
func TestBatchLostCancelsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 3)
		entered, cancelled := make(chan struct{}), make(chan error, 1)
		h := func(ctx context.Context, recs []runner.Record) error {
			close(entered)
			<-ctx.Done()
			cancelled <- ctx.Err()
			return ctx.Err()
		}
		// Under Skip(1) a cancelled batch that counted as failed would be
		// skipped: it must be left incomplete instead.
		m := newMeter()
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.Skip(1))), runner.MeterProvider(m.provider),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		<-entered
		if err := src.Lose(context.Background(), tp(0)); err != nil {
			t.Fatal(err)
		}
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("the batch's ctx ended with %v, want Canceled", err)
		}
		await(t, time.Second, "nothing committed", func() bool { _, ok := src.Committed(tp(0)); return !ok })
		if n := m.sum(t, "tidemark.records.skipped"); n != 0 {
			t.Fatalf("tidemark.records.skipped = %d: the lost batch was given up, want it left incomplete", n)
		}
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestBatchRevokeWaitsForIt: a revoke waits for the batch in flight, then
// commits past it.
func TestBatchRevokeWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 3)
		entered, release := make(chan struct{}), make(chan struct{})
		h := func(ctx context.Context, recs []runner.Record) error {
			close(entered)
			<-release
			return nil
		}
		r := newRunner(t, src, runner.HandleBatch(topic, h), runner.DrainBudget(time.Minute), runner.CommitInterval(time.Hour))
		started(t, r)
		assign(t, src, tp(0))
		<-entered
		revoked := make(chan error, 1)
		go func() { revoked <- src.Revoke(context.Background(), tp(0)) }()
		time.Sleep(30 * time.Second) // fake time, within the drain budget
		synctest.Wait()
		select {
		case err := <-revoked:
			t.Fatalf("Revoke returned %v with the batch in flight", err)
		default:
		}
		close(release)
		if err := <-revoked; err != nil {
			t.Fatalf("Revoke returned %v, want nil", err)
		}
		if off, ok := src.Committed(tp(0)); !ok || off != 3 {
			t.Fatalf("committed %d (%v) after the revoke, want 3", off, ok)
		}
	})
}

// TestBatchSizeMetric: every batch is measured in tidemark.batch.size, in
// records.
func TestBatchSizeMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 10)
		m := newMeter()
		r := newRunner(t, src, runner.HandleBatch(topic, func(context.Context, []runner.Record) error { return nil }, runner.BatchSize(4)),
			runner.MeterProvider(m.provider), runner.CommitInterval(2*time.Millisecond), runner.Order(runner.Unordered))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed", committedAt(src, 0, 10))
		hist, ok := m.metric(t, "tidemark.batch.size").(metricdata.Histogram[int64])
		if !ok || len(hist.DataPoints) != 1 {
			t.Fatalf("tidemark.batch.size: %T %+v, want one histogram data point", m.metric(t, "tidemark.batch.size"), hist)
		}
		dp := hist.DataPoints[0]
		if mx, _ := dp.Max.Value(); dp.Sum != 10 || dp.Count < 3 || mx > 4 {
			t.Fatalf("tidemark.batch.size: %d batches, %d records, max %d; want 10 records in batches of at most 4", dp.Count, dp.Sum, mx)
		}
		if v, _ := dp.Attributes.Value("messaging.destination.name"); v.AsString() != topic {
			t.Fatalf("tidemark.batch.size topic %q, want %q", v.AsString(), topic)
		}
	})
}

// TestBatchConfigErrors: bad batch options and HandleBatch over a share
// group are refused by New with a *ConfigError naming them.
func TestBatchConfigErrors(t *testing.T) {
	nop := func(context.Context, []runner.Record) error { return nil }
	for _, tc := range []struct {
		name string
		src  runner.Source
		opts []runner.Option
		want string
	}{
		{"BatchSize on Handle", runnertest.New(), []runner.Option{runner.Handle(topic, func(context.Context, runner.Record) error { return nil }, runner.BatchSize(3))}, `Handle("t").BatchSize`},
		{"BatchWait on Handle", runnertest.New(), []runner.Option{runner.Handle(topic, func(context.Context, runner.Record) error { return nil }, runner.BatchWait(time.Second))}, `Handle("t").BatchWait`},
		{"BatchSize 0", runnertest.New(), []runner.Option{runner.HandleBatch(topic, nop, runner.BatchSize(0))}, `Handle("t").BatchSize`},
		{"BatchSize above the high water mark", runnertest.New(), []runner.Option{runner.HandleBatch(topic, nop, runner.BatchSize(11)), runner.WaterMarks(10, 5)}, `Handle("t").BatchSize`},
		{"BatchWait negative", runnertest.New(), []runner.Option{runner.HandleBatch(topic, nop, runner.BatchWait(-1))}, `Handle("t").BatchWait`},
		{"nil handler", runnertest.New(), []runner.Option{runner.HandleBatch(topic, nil)}, "nil handler"},
		{"share group", newSettleSource(), []runner.Option{runner.HandleBatch(topic, nop), runner.Failure(runner.Skip(1))}, `HandleBatch("t")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runner.New(tc.src, tc.opts...)
			var ce *runner.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New returned %v, want a *ConfigError naming %s", err, tc.want)
			}
		})
	}
}

// TestBatchErrorKinds: a batch's failures follow the error kinds as a
// record's do, under DeadLetter(1): a panic is a failed attempt, Transient
// is retried without counting, ErrOutcomeUnknown is never given up, and
// ErrFenced leaves the records to the next owner, neither completed nor
// retried (the commit stays at the first fenced record).
func TestBatchErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail returns the error of call i (from 1), or nil.
		fail        func(i int) error
		panics      bool // call 1 panics instead
		calls       int  // handler calls
		deadLetters int
		commit      int64
	}{
		{"panic", nil, true, 1, 3, 3}, // DeadLetter(1): the whole batch failed, each record dead-lettered
		{"transient", func(i int) error {
			if i <= 3 {
				return runner.Transient(errPoison)
			}
			return nil
		}, false, 4, 0, 3},
		{"outcome unknown", func(i int) error {
			if i <= 3 {
				return fmt.Errorf("commit lost: %w", runner.ErrOutcomeUnknown)
			}
			return nil
		}, false, 4, 0, 3},
		{"fenced at record 1", func(i int) error {
			return &runner.BatchError{Index: 1, Err: fmt.Errorf("lease moved: %w", runner.ErrFenced)}
		}, false, 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := runnertest.New()
				appendN(src, 0, 3)
				d := &dlq{allow: make(chan struct{})}
				close(d.allow)
				var mu sync.Mutex
				calls := 0
				h := func(ctx context.Context, recs []runner.Record) error {
					mu.Lock()
					calls++
					i := calls
					mu.Unlock()
					if tc.panics {
						panic("boom")
					}
					return tc.fail(i)
				}
				m := newMeter()
				r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 1, d))),
					runner.Order(runner.PartitionOrder), runner.MeterProvider(m.provider),
					runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
				started(t, r)
				assign(t, src, tp(0))
				await(t, time.Second, fmt.Sprintf("committed %d", tc.commit), committedAt(src, 0, tc.commit))
				mu.Lock()
				defer mu.Unlock()
				d.mu.Lock()
				defer d.mu.Unlock()
				wantDL := tc.deadLetters
				if calls != tc.calls || len(d.got) != wantDL {
					t.Fatalf("%d handler calls and %d dead letters, want %d and %d", calls, len(d.got), tc.calls, wantDL)
				}
				if tc.panics {
					if e, _ := d.got[0].Header(runner.HeaderErrorType); string(e) != "*runner.PanicError" {
						t.Fatalf("dead letter error type %q, want *runner.PanicError", e)
					}
				}
				if strings.HasPrefix(tc.name, "fenced") {
					// Records 1 and 2, the part of the batch the fence left
					// to the next owner: the metric counts records.
					if n := m.sum(t, "tidemark.records.fenced"); n != 2 {
						t.Fatalf("tidemark.records.fenced = %d, want 2", n)
					}
				}
			})
		})
	}
}

// TestBatchSkipsAppliedRecords: records the partition's Applied filter
// finds applied complete without reaching the handler.
func TestBatchSkipsAppliedRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 5)
		var log batchLog
		hook := func(ctx context.Context, as []runner.Assignment) ([]runner.Applied, error) {
			return []runner.Applied{func(off int64) bool { return off == 1 || off == 3 }}, nil
		}
		m := newMeter()
		r := newRunner(t, src, runner.HandleBatch(topic, func(ctx context.Context, recs []runner.Record) error {
			log.add(ctx, recs)
			return nil
		}), runner.OnAssign(hook), runner.MeterProvider(m.provider), runner.Order(runner.PartitionOrder), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "committed 5", committedAt(src, 0, 5))
		if got, want := log.get(), []batchCall{{[]int64{0, 2, 4}, 1}}; !callsEqual(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		if n := m.sum(t, "tidemark.records.replay_skipped"); n != 2 {
			t.Fatalf("tidemark.records.replay_skipped = %d, want 2", n)
		}
	})
}

// TestBatchErrorKeepsItsKind: a mark outside or inside the *BatchError
// decides its kind alike: Permanent dead-letters the named record at
// once, whose headers carry the record's own error.
func TestBatchErrorKeepsItsKind(t *testing.T) {
	for name, wrap := range map[string]func(i int) error{
		"Permanent outside": func(i int) error { return runner.Permanent(&runner.BatchError{Index: i, Err: errPoison}) },
		"Permanent inside":  func(i int) error { return &runner.BatchError{Index: i, Err: runner.Permanent(errPoison)} },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := runnertest.New()
				appendN(src, 0, 3)
				var log batchLog
				d := &dlq{allow: make(chan struct{})}
				close(d.allow)
				h := func(ctx context.Context, recs []runner.Record) error {
					log.add(ctx, recs)
					for i, r := range recs {
						if r.Offset == 1 {
							return wrap(i)
						}
					}
					return nil
				}
				r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 5, d))),
					runner.Order(runner.PartitionOrder), runner.Backoff(time.Millisecond, time.Millisecond), runner.CommitInterval(2*time.Millisecond))
				started(t, r)
				assign(t, src, tp(0))
				await(t, time.Second, "committed past the batch", committedAt(src, 0, 3))
				if got, want := log.get(), []batchCall{{[]int64{0, 1, 2}, 1}, {[]int64{2}, 1}}; !callsEqual(got, want) {
					t.Fatalf("calls %v, want %v", got, want)
				}
				d.mu.Lock()
				defer d.mu.Unlock()
				if len(d.got) != 1 || d.got[0].Offset != 1 {
					t.Fatalf("dead letters %v, want offset 1 alone", d.got)
				}
				for k, v := range map[string]string{runner.HeaderErrorKind: "permanent", runner.HeaderAttempts: "1", runner.HeaderErrorType: "*errors.errorString"} {
					if hv, _ := d.got[0].Header(k); string(hv) != v {
						t.Errorf("header %s = %q, want %q", k, hv, v)
					}
				}
			})
		})
	}
}

// TestBatchTimeoutSaysSo: a batch that runs past its topic's WithTimeout
// fails with a *TimeoutError, as a record does, and its dead letters say so.
func TestBatchTimeoutSaysSo(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		appendN(src, 0, 2)
		d := &dlq{allow: make(chan struct{})}
		close(d.allow)
		h := func(ctx context.Context, recs []runner.Record) error {
			<-ctx.Done()
			return ctx.Err()
		}
		r := newRunner(t, src, runner.HandleBatch(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 1, d)),
			runner.WithTimeout(time.Second)), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Minute, "committed past the dead letters", committedAt(src, 0, 2))
		d.mu.Lock()
		defer d.mu.Unlock()
		for i, dl := range d.got {
			if msg, _ := dl.Header(runner.HeaderError); !strings.Contains(string(msg), "timed out after 1s") {
				t.Errorf("dead letter %d: %s = %q, want the *runner.TimeoutError's message", i, runner.HeaderError, msg)
			}
		}
		if len(d.got) != 2 {
			t.Fatalf("%d dead letters, want 2", len(d.got))
		}
	})
}
