package share_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// budgetSpy is a share source whose hand-overs are checked against the
// runner's budget: each Fetched may carry at most what the last Fetched,
// of any session, returned.
type budgetSpy struct {
	*share.Source
	mu        sync.Mutex
	last      int
	calls     int
	violation string
}

func (b *budgetSpy) Run(ctx context.Context, sink runner.Sink) error {
	return b.Source.Run(ctx, budgetSink{sink, b})
}

type budgetSink struct {
	runner.Sink
	b *budgetSpy
}

func (k budgetSink) Fetched(ctx context.Context, batches []runner.Batch) (int, error) {
	n := 0
	for _, bt := range batches {
		n += len(bt.Records)
	}
	b := k.b
	b.mu.Lock()
	if n > 0 {
		b.calls++
		if b.last > 0 && n > b.last && b.violation == "" {
			b.violation = fmt.Sprintf("a hand-over of %d records after the runner's budget of %d", n, b.last)
		}
	}
	b.mu.Unlock()
	budget, err := k.Sink.Fetched(ctx, batches)
	if err == nil {
		b.mu.Lock()
		b.last = budget
		b.mu.Unlock()
	}
	return budget, err
}

// TestSessionsShareTheBudget: the runner's budget is one for the whole
// source: its sessions, which poll at once, never hand over more than
// the runner's last answer allows, so no partition passes its high water
// mark through hand-overs. (Each session kept the budget of its own last
// hand-over, and four of them handed over on stale budgets.)
func TestSessionsShareTheBudget(t *testing.T) {
	const n = 600
	c := fake(t, "t", 1, n)
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(4), share.MaxPollRecords(40))
	if err != nil {
		t.Fatal(err)
	}
	spy := &budgetSpy{Source: src}
	var mu sync.Mutex
	seen := map[int64]bool{}
	r, err := runner.New(spy, runner.Handle("t", func(_ context.Context, rec runner.Record) error {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		seen[rec.Offset] = true
		mu.Unlock()
		return nil
	}), runner.Failure(runner.Skip(1)), runner.WaterMarks(30, 15), runner.Concurrency(4))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	waitFor(t, "every record handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == n })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if spy.violation != "" {
		t.Errorf("%s (%d hand-overs)", spy.violation, spy.calls)
	}
}
