package runner_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestPoisonKeyFillsTheWindowThenPauses: the everyday case of a stuck
// record, default Block and KeyOrder with one poison key. The other keys go
// on until the partition's uncommitted window (twice the high water mark by
// default) is full; then the partition pauses and stays paused: nothing more
// is fetched, memory stays flat. (The window behind the stuck record grew
// without bound: 19,980 records handled and outstanding behind offset 0,
// with a high water mark of 100.)
func TestPoisonKeyFillsTheWindowThenPauses(t *testing.T) {
	t.Parallel()
	const high, low, n, keys = 100, 50, 20_000, 1000
	const window = 2 * high
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		recs := records(0, 0, n, keys) // offset i has key k(i%1000): k0 at 0, 1000, 2000, ...
		src.Append(recs[0])
		var handled atomic.Int64
		m := newMeter()
		logs := &logBuffer{}
		r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			if string(rec.Key) == "k0" {
				return errPoison
			}
			handled.Add(1)
			return nil
		}), runner.WaterMarks(high, low), runner.CommitInterval(10*time.Millisecond),
			runner.MeterProvider(m.provider), runner.Logger(logs.logger()))
		started(t, r)
		assign(t, src, tp(0))
		// The poison record fails its first attempt before the rest comes,
		// so the window fills behind a record that is retrying. (With all
		// of them at once, the window could fill while offset 0 was still
		// in its first attempt, and the log line said state=running: the
		// test failed about once in eight runs under -race.)
		synctest.Wait()
		src.Append(recs[1:]...)
		time.Sleep(time.Minute) // fake time: a minute of retries (15 or so)
		synctest.Wait()
		first := handled.Load()
		if first > window {
			t.Fatalf("%d records handled behind the stuck offset 0: the uncommitted window (%d) does not hold", first, window)
		}
		if first < window/2 {
			t.Fatalf("only %d records handled: the other keys did not go on", first)
		}
		if !src.Paused(tp(0)) {
			t.Fatal("the partition is not paused with its window full")
		}
		s := r.Stats()
		p := s.Partitions[0]
		t.Logf("%d handled behind offset 0; partition stats %+v", first, p)
		if p.Outstanding > window || !p.WindowFull || p.OldestOffset != 0 || p.OldestState != runner.Retrying ||
			p.OldestAttempts < 10 || p.OldestError != errPoison.Error() || p.OldestAge < 50*time.Second {
			t.Fatalf("stats %+v: want at most %d outstanding, the window full, and offset 0 the oldest, retrying for a minute with %q", p, window, errPoison)
		}
		if n := m.sum(t, "tidemark.partitions.window_pauses"); n != 1 {
			t.Fatalf("tidemark.partitions.window_pauses = %d, want 1", n)
		}
		if ids := m.partitionsOf(t, "tidemark.partitions.window_pauses"); len(ids) != 1 || ids[0] != "0" {
			t.Fatalf("tidemark.partitions.window_pauses has data points for partitions %q, want partition 0", ids)
		}
		if g := m.gauge(t, "tidemark.partition.uncommitted"); g != int64(p.Outstanding) {
			t.Fatalf("tidemark.partition.uncommitted = %d, want %d", g, p.Outstanding)
		}
		if st := m.attr(t, "tidemark.record.oldest_age", "tidemark.record.state"); st != "retrying" {
			t.Fatalf("tidemark.record.oldest_age's state = %q, want retrying", st)
		}
		if !logs.has("uncommitted window is full", "oldest=t/0@0", "state=retrying", "err="+errPoison.Error()) {
			t.Fatalf("no log line says the window is full behind t/0@0, retrying: %s", logs)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		again := r.Stats()
		if n := handled.Load(); n != first || again.Bytes != s.Bytes || again.Partitions[0].Outstanding != p.Outstanding {
			t.Fatalf("handled %d, then %d; charged %d bytes, then %d: the partition went on behind a full window", first, n, s.Bytes, again.Bytes)
		}
		if off, ok := src.Committed(tp(0)); ok && off != 0 {
			t.Fatalf("committed %d past the stuck record", off)
		}
	})
}

// TestFencedRecordFillsTheWindow: a fenced record holds the commit like a
// stuck one; the window bounds what finishes behind it, and the stats say
// it is fenced.
func TestFencedRecordFillsTheWindow(t *testing.T) {
	const high, low, n, keys = 100, 50, 5_000, 1000
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 1, n, keys)
		var handled atomic.Int64
		r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			if rec.Offset == 0 {
				return fmt.Errorf("lease moved: %w", runner.ErrFenced)
			}
			handled.Add(1)
			return nil
		}), runner.WaterMarks(high, low), runner.Window(3*high), runner.CommitInterval(10*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		time.Sleep(time.Minute)
		synctest.Wait()
		p := r.Stats().Partitions[0]
		// The window holds it paused: its outstanding records are above
		// the window's low mark (window - (high - low)), where it would
		// resume. Whether the last pause came from the window (WindowFull)
		// or from the high water mark depends on how the polls split the
		// backlog; either way it cannot resume behind the fenced record.
		if h := handled.Load(); h > 3*high || p.Outstanding > 3*high || p.Outstanding <= 3*high-(high-low) || !src.Paused(tp(0)) {
			t.Fatalf("handled %d; stats %+v: want at most %d handled and outstanding, above the window's low mark %d, the partition paused", h, p, 3*high, 3*high-(high-low))
		}
		if p.OldestOffset != 0 || p.OldestState != runner.Fenced || p.OldestAge < 50*time.Second {
			t.Fatalf("stats %+v: want offset 0 the oldest, fenced for a minute", p)
		}
	})
}
