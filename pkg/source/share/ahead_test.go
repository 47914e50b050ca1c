package share_test

// Tests of the records franz-go fetches ahead of a poll: a fetch that
// "slips out" as a poll returns (franz-go's fetch manager grants a fetch
// while the poll is still active, after the poll took the buffered one)
// acquires records that wait in the client, their locks running, until the
// session's next poll. The tests force that race: a client hook that runs
// inside PollRecords (the unbuffered hooks run before it returns) holds
// the poll open, so the fetch manager sees it active and starts the next
// fetch.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// slipHook holds PollRecords open for hold when a poll returns offset at
// (the first time, or every time when every is set), so the client starts
// its next fetch before the poll returns; it notes each offset buffered and
// when.
type slipHook struct {
	at    int64
	every bool
	hold  time.Duration
	fired atomic.Bool

	mu       sync.Mutex
	buffered map[int64]time.Time // first time each offset was buffered
}

func (h *slipHook) OnFetchRecordBuffered(r *kgo.Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.buffered == nil {
		h.buffered = map[int64]time.Time{}
	}
	if _, ok := h.buffered[r.Offset]; !ok {
		h.buffered[r.Offset] = time.Now()
	}
}

func (h *slipHook) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled || r.Offset != h.at {
		return
	}
	if h.fired.Swap(true) && !h.every {
		return
	}
	time.Sleep(h.hold)
}

func (h *slipHook) bufferedAt(off int64) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.buffered[off]
	return at, ok
}

// slipShare is a one-broker kfake with n records on topic t/0 and a
// one-session share source of group g fetching maxPoll at a time, lock
// lockMs and delivery limit limit, with h on its client.
func slipShare(t *testing.T, n, maxPoll int, lockMs, limit string, h *slipHook, opts ...share.Option) (*kfake.Cluster, *share.Source) {
	t.Helper()
	c := fake(t, "t", 1, n, kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": lockMs,
		"group.share.delivery.count.limit":    limit,
		"share.record.lock.sweep.interval.ms": "100",
	}))
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, append([]share.Option{share.Sessions(1), share.MaxPollRecords(maxPoll),
		share.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond), kgo.WithHooks(h))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c, src
}

// TestSlippedFetchWhileSettling: a fetch that slipped out as the first
// poll returned (offsets 4-7) waits in the client while offset 0 runs for
// two lock durations (its lock renewed). Every record must run once, at
// its first delivery: docs/share.md promises that records are not
// acquired long before they run, and a record whose lock ran out in the
// client comes back with its delivery count raised, towards the limit,
// without a handler attempt.
func TestSlippedFetchWhileSettling(t *testing.T) {
	t.Parallel()
	const n = 8
	h := &slipHook{at: 0, hold: 300 * time.Millisecond}
	c, src := slipShare(t, n, 4, "3000", "2", h)
	var d deliveries
	var slipped atomic.Bool
	stop := run(t, src, runner.Handle("t", func(ctx context.Context, rec runner.Record) error {
		d.add(rec)
		if rec.Offset == 0 && rec.DeliveryCount == 1 {
			select {
			case <-time.After(6 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
			_, ok := h.bufferedAt(4)
			slipped.Store(ok)
		}
		return nil
	}), runner.Failure(runner.Skip(1)), runner.Order(runner.Unordered))
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, "g", "t") == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !slipped.Load() {
		t.Fatalf("offset 4 was not buffered while offset 0 ran: no fetch slipped out, the test proves nothing")
	}
	for off := range int64(n) {
		if got := d.of(off); len(got) != 1 || got[0] != 1 {
			t.Errorf("offset %d: handler calls with delivery counts %v, want one call at delivery 1", off, got)
		}
	}
}

// TestSlippedFetchWhilePaused: the runner's flow control pauses the
// source for two lock durations while the client holds a fetch that
// slipped out. One session, a fetch of 8, water marks (4, 2): offsets 0-3
// are handed over and block; 4-7 wait in the session (renewed, handed over
// as the runner resumes); 8-15, fetched as the poll returned, wait in the
// client. Every record must run once, at its first delivery.
func TestSlippedFetchWhilePaused(t *testing.T) {
	t.Parallel()
	const n = 16
	h := &slipHook{at: 0, hold: 300 * time.Millisecond}
	c, src := slipShare(t, n, 8, "3000", "2", h)
	var d deliveries
	var slipped atomic.Bool
	stop := run(t, src, runner.Handle("t", func(ctx context.Context, rec runner.Record) error {
		d.add(rec)
		if rec.Offset < 4 && rec.DeliveryCount == 1 {
			select {
			case <-time.After(6 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
			if _, ok := h.bufferedAt(8); ok {
				slipped.Store(true)
			}
		}
		return nil
	}), runner.Failure(runner.Skip(1)), runner.WaterMarks(4, 2), runner.Concurrency(8), runner.Order(runner.Unordered))
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, "g", "t") == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !slipped.Load() {
		t.Fatalf("offset 8 was not buffered while offsets 0-3 ran: no fetch slipped out, the test proves nothing")
	}
	for off := range int64(n) {
		if got := d.of(off); len(got) != 1 || got[0] != 1 {
			t.Errorf("offset %d: handler calls with delivery counts %v, want one call at delivery 1", off, got)
		}
	}
}
