package runner_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestPauseAtHighResumeAtLow checks invariant 6: a partition's buffered plus
// in-flight records never exceed the high water mark; it is paused there and
// resumed once it falls to the low water mark.
func TestPauseAtHighResumeAtLow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const high, low, n = 40, 10, 400
		src := runnertest.New()
		src.BatchSize = 25
		fill(src, 2, n, 1000)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		var handled atomic.Int64
		h := func(ctx context.Context, rec runner.Record) error {
			<-release
			handled.Add(1)
			return nil
		}
		m := newMeter()
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.Unordered), runner.MeterProvider(m.provider),
			runner.Concurrency(4), runner.WaterMarks(high, low), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		// A second of fake time (a hundred polls) gives the source every
		// chance to overshoot before looking.
		await(t, time.Second, "both partitions paused at the high water mark", func() bool { return src.Paused(tp(0)) && src.Paused(tp(1)) })
		for _, p := range r.Stats().Partitions {
			if p.Buffered > high {
				t.Fatalf("%s holds %d records, above the high water mark %d", p.TP, p.Buffered, high)
			}
			// Paused once the room left is below half the gap between the marks.
			if p.Buffered <= high-(high-low)/2 {
				t.Fatalf("%s paused with %d records, with room for a poll under the high water mark %d", p.TP, p.Buffered, high)
			}
		}
		// Let records through one by one; sample the bound after each, once
		// a tick refreshed the stats.
		for i := range 2 * n {
			select {
			case release <- struct{}{}:
			case <-time.After(time.Second):
				t.Fatalf("no handler took record %d of %d within a second; stats %+v", i+1, 2*n, r.Stats())
			}
			time.Sleep(2 * time.Millisecond)
			synctest.Wait()
			for _, p := range r.Stats().Partitions {
				if p.Buffered > high {
					t.Fatalf("%s holds %d records, above the high water mark %d", p.TP, p.Buffered, high)
				}
			}
		}
		if h := handled.Load(); h != 2*n {
			t.Fatalf("handled %d records, want %d", h, 2*n)
		}
		// 400 records per partition through a window of 40 means many cycles of
		// pause (at 40) and resume (at 10): a partition is paused again only
		// after it was resumed.
		if n := m.sum(t, "tidemark.partitions.pauses"); n < 10 {
			t.Fatalf("%d pauses for 800 records through a 40-record window: partitions were not resumed at the low water mark", n)
		}
		if ids := m.partitionsOf(t, "tidemark.partitions.pauses"); len(ids) != 2 || ids[0] == "" || ids[1] == "" {
			t.Fatalf("tidemark.partitions.pauses has data points for partitions %q, want one per partition", ids)
		}
		await(t, time.Second, "all committed", committedAt(src, 0, n))
	})
}

// TestByteCapPausesEverything checks the global limit of MaxBufferedBytes:
// it pauses every partition, also those below their own byte water mark,
// and the runner's charge stays within its share of the cap.
func TestByteCapPausesEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxBytes, highBytes = 120_000, 60_000
		src := runnertest.New()
		src.BatchSize = 2
		big := make([]byte, 4000)
		for p := range int32(3) {
			for i := range int64(50) {
				src.Append(runner.Record{Topic: topic, Partition: p, Offset: i, Key: []byte{byte(i)}, Value: big})
			}
		}
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		t.Cleanup(open)
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			<-release
			return nil
		}), runner.Concurrency(2), runner.WaterMarks(20, 10), runner.ByteWaterMarks(highBytes, highBytes/2),
			runner.MaxBufferedBytes(maxBytes), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0), tp(1), tp(2))
		var s runner.Stats
		await(t, time.Second, "all partitions paused by the byte cap, in the stats", func() bool {
			s = r.Stats()
			paused := 0
			for _, p := range s.Partitions {
				if p.Paused {
					paused++
				}
			}
			return paused == 3
		})
		below := 0
		for _, p := range s.Partitions {
			if p.Bytes < highBytes {
				below++
			}
		}
		if below == 0 {
			t.Fatalf("every partition reached its own byte mark (%+v); the global limit was not what paused them", s.Partitions)
		}
		if share := int64(maxBytes * (1 - runner.SourceShare)); s.Bytes > share {
			t.Fatalf("the runner is charged %d bytes, above its share %d of MaxBufferedBytes", s.Bytes, share)
		}
		open()
		for p := range int32(3) {
			await(t, time.Second, "all committed", committedAt(src, p, 50))
		}
	})
}

// TestGlobalPauseLiftsAfterALoss: when the bytes that hit the global cap
// belonged to a partition that is then lost, the cap lifts and the other
// partitions resume (they used to stay paused forever).
func TestGlobalPauseLiftsAfterALoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		big := make([]byte, 10_000)
		for i := range 20 {
			src.Append(runner.Record{Topic: topic, Partition: 0, Offset: int64(i), Value: big})
		}
		var handled1 atomic.Int64
		h := func(ctx context.Context, rec runner.Record) error {
			if rec.Partition == 0 {
				<-ctx.Done()
				return ctx.Err()
			}
			handled1.Add(1)
			return nil
		}
		// The global limit is about 8 of these records (memory.go's
		// globalLimits), partition 0's own byte mark about 14.
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.Unordered), runner.Concurrency(1),
			runner.WaterMarks(20, 10), runner.ByteWaterMarks(150_000, 75_000), runner.MaxBufferedBytes(200_000),
			runner.CommitInterval(5*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "partition 0 paused", func() bool { return src.Paused(tp(0)) })
		assign(t, src, tp(1))
		await(t, time.Second, "partition 1 paused by the global cap", func() bool { return src.Paused(tp(1)) })
		for i := range 5 {
			src.Append(runner.Record{Topic: topic, Partition: 1, Offset: int64(i), Value: []byte("x")})
		}
		if err := src.Lose(context.Background(), tp(0)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if handled1.Load() < 5 {
			t.Fatalf("partition 1 still paused=%v after partition 0 was lost; stats %+v", src.Paused(tp(1)), r.Stats())
		}
	})
}
