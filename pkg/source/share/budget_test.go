package share_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// lockedShare starts a one-broker kfake with n records on topic t and a
// one-session share source of group g fetching 8 at a time, under the
// broker's lock duration lockMs and delivery limit (kfake takes both from
// the broker's configs, not the group's).
func lockedShare(t *testing.T, n int, lockMs, limit string) (*kfake.Cluster, *share.Source) {
	t.Helper()
	c := fake(t, "t", 1, n, kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": lockMs,
		"group.share.delivery.count.limit":    limit,
		"share.record.lock.sweep.interval.ms": "100",
	}))
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1), share.MaxPollRecords(8),
		// Well under the lock: a fetch in flight holds the acks.
		share.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	return c, src
}

// deliveries records the delivery count of each handler call, by offset.
type deliveries struct {
	mu     sync.Mutex
	counts map[int64][]int32
}

func (d *deliveries) add(rec runner.Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.counts == nil {
		d.counts = map[int64][]int32{}
	}
	d.counts[rec.Offset] = append(d.counts[rec.Offset], rec.DeliveryCount)
}

func (d *deliveries) of(off int64) []int32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[off]
}

// TestBudgetBelowMaxPollRecords: when the runner's budget is below
// MaxPollRecords, the records a fetch acquired beyond it must not wait in
// the client with their locks running: the broker would deliver them
// again and, at the delivery limit, archive them before any handler saw
// them. One session, a fetch of 8, water marks (10, 8): the budget after
// the first hand-overs is under 8. Even offsets outlast the 2 s lock
// (theirs are renewed); every offset must reach a handler, each at its first
// delivery.
func TestBudgetBelowMaxPollRecords(t *testing.T) {
	t.Parallel()
	const topic, group, n = "t", "g", 8
	c, src := lockedShare(t, n, "2000", "2")
	var d deliveries
	stop := run(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		d.add(rec)
		if rec.Offset%2 == 0 {
			select {
			case <-time.After(5 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}), runner.Failure(runner.Skip(1)), runner.WaterMarks(10, 8), runner.Concurrency(8), runner.Order(runner.Unordered))
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, group, topic) == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for off := range int64(n) {
		if got := d.of(off); len(got) != 1 || got[0] != 1 {
			t.Errorf("offset %d: handler calls with delivery counts %v, want one call at delivery 1", off, got)
		}
	}
}

// TestExpiredAcksGoAlone: acks for acquisitions whose lock expired must
// not share a request with good ones, or the broker refuses the whole
// partition's acks (INVALID_RECORD_STATE) and a record whose handler
// succeeded comes back and runs again. The session polls 2 of each fetch
// of 8 (the client keeps the rest, as it does a fetch that slipped out
// while a poll returned); their locks expire while offset 0 runs past the
// lock (renewed), so the next poll brings records already expired. Offset
// 0 must run once; the expired ones come back and run.
func TestExpiredAcksGoAlone(t *testing.T) {
	t.Parallel()
	const topic, group, n = "t", "g", 8
	c, src := lockedShare(t, n, "1000", "3")
	src.PollCapForTest(2)
	var d deliveries
	stop := run(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		d.add(rec)
		if rec.Offset == 0 {
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}), runner.Failure(runner.Skip(1)), runner.Order(runner.Unordered))
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, group, topic) == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := d.of(0); len(got) != 1 || got[0] != 1 {
		t.Errorf("offset 0: handler calls with delivery counts %v, want one call at delivery 1: its ACCEPT was refused with an expired lock's ack", got)
	}
	for off := range int64(n) {
		if len(d.of(off)) == 0 {
			t.Errorf("offset %d never reached a handler", off)
		}
	}
}
