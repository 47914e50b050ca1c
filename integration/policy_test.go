//go:build integration

package integration_test

// The failure policy on the real broker: Skip, and HandlerTimeout
// (invariant 9).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// counter returns the total of an Int64 counter read from reader.
func counter(t *testing.T, reader *metric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range s.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}

// TestSkipOnBroker: with Skip(3) a record that always fails is tried
// exactly three times, then logged at error level naming the record and
// its error, counted once in tidemark.records.skipped, and passed: the
// group's commit reaches the end of the partition (invariant 9). A Skip
// that completed the record early (fewer attempts), silently (no log line
// or count), or not at all (the commit stuck at the record) fails it.
func TestSkipOnBroker(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, poison = 20, 7
	topic, group := bed.Topic(t, 1), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "k" + strconv.Itoa(i) })

	var mu sync.Mutex
	calls := map[int64]int{}
	h := func(ctx context.Context, rec runner.Record) error {
		mu.Lock()
		calls[rec.Offset]++
		mu.Unlock()
		if rec.Offset == poison {
			return errors.New("cannot handle this one")
		}
		return nil
	}
	var logs kafkatest.LogBuffer
	reader := metric.NewManualReader()
	provider := metric.NewMeterProvider(metric.WithReader(reader))
	defer provider.Shutdown(context.Background()) //nolint:errcheck
	m := runMember(t, "m", franzSource(t, group, topic), topic, h,
		runner.Failure(runner.Skip(3)), runner.Backoff(5*time.Millisecond, 20*time.Millisecond),
		runner.Logger(logs.Logger(slog.LevelWarn)),
		runner.MeterProvider(provider))
	waitCommitted(t, group, topic, map[int32]int64{0: n}, time.Minute)
	m.Stop(t)

	mu.Lock()
	defer mu.Unlock()
	for off := range int64(n) {
		want := 1
		if off == poison {
			want = 3
		}
		if calls[off] != want {
			t.Errorf("offset %d: %d attempts, want %d", off, calls[off], want)
		}
	}
	if got := counter(t, reader, "tidemark.records.skipped"); got != 1 {
		t.Errorf("tidemark.records.skipped = %d, want 1", got)
	}
	rec := fmt.Sprintf("%s/0@%d", topic, poison)
	var skipped []map[string]any
	for _, l := range logs.Lines(t) {
		if l["record"] == rec && l["msg"] == "record skipped after its last attempt" {
			skipped = append(skipped, l)
		}
	}
	if len(skipped) != 1 {
		t.Fatalf("%d log lines say %s was skipped, want 1; log:\n%s", len(skipped), rec, logs.String())
	}
	l := skipped[0]
	if l["level"] != "ERROR" || l["attempts"] != float64(3) || !containsAll(fmt.Sprint(l["err"]), "cannot handle this one") {
		t.Errorf("skip log line %v: want level ERROR, attempts 3 and the record's error", l)
	}
}

// TestHandlerTimeoutOnBroker: with HandlerTimeout(5s) an attempt that
// runs past it has its ctx ended with DeadlineExceeded and counts as a
// failed attempt (invariant 9): while it runs the group's commit stays at
// the record although every later record (other keys) is done, and the
// record is retried and then passed. A timeout that did not end the ctx,
// that completed the record instead of retrying it, or a commit that moved
// past the running attempt fails it.
func TestHandlerTimeoutOnBroker(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	// The timeout leaves the commit of the records before the slow one
	// time to reach the broker while the first attempt runs, also on a
	// loaded machine (1.5 s did not, with make test's phases beside it).
	const n, slow, timeout = 10, 3, 5 * time.Second
	topic, group := bed.Topic(t, 1), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "k" + strconv.Itoa(i) })

	var (
		mu       sync.Mutex
		attempts int
		firstErr error
		firstDur time.Duration
		inFirst  = make(chan struct{})
	)
	h := func(ctx context.Context, rec runner.Record) error {
		if rec.Offset != slow {
			return nil
		}
		mu.Lock()
		attempts++
		a := attempts
		mu.Unlock()
		if a > 1 {
			return nil
		}
		close(inFirst)
		began := time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		mu.Lock()
		firstErr, firstDur = ctx.Err(), time.Since(began)
		mu.Unlock()
		return ctx.Err()
	}
	m := runMember(t, "m", franzSource(t, group, topic), topic, h,
		runner.HandlerTimeout(timeout), runner.Backoff(5*time.Millisecond, 20*time.Millisecond))
	<-inFirst
	began := time.Now()
	waitCommitted(t, group, topic, map[int32]int64{0: slow}, time.Minute)
	mu.Lock()
	stillFirst := firstErr == nil && attempts == 1
	mu.Unlock()
	if !stillFirst {
		t.Fatalf("the first attempt ended (after %v) before the commit reached %d: too slow to check that the commit waited", time.Since(began), slow)
	}
	waitCommitted(t, group, topic, map[int32]int64{0: n}, time.Minute)
	m.Stop(t)

	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(firstErr, context.DeadlineExceeded) {
		t.Errorf("first attempt's ctx ended with %v, want context.DeadlineExceeded", firstErr)
	}
	if firstDur < timeout-100*time.Millisecond || firstDur > timeout+2*time.Second {
		t.Errorf("first attempt lasted %v, want about the %v timeout", firstDur, timeout)
	}
	if attempts != 2 {
		t.Errorf("%d attempts of offset %d, want 2 (the timed-out one and its retry)", attempts, slow)
	}
}
