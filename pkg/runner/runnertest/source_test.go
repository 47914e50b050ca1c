package runnertest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// countSink counts the records handed over per partition.
type countSink struct {
	mu      sync.Mutex
	fetched map[runner.TP]int
}

func (k *countSink) Assigned(context.Context, []runner.Assignment) error { return nil }
func (k *countSink) Revoked(context.Context, []runner.TP, time.Time) error {
	return nil
}
func (k *countSink) Lost(context.Context, []runner.TP) error { return nil }
func (k *countSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range bs {
		k.fetched[b.TP] += len(b.Records)
	}
	return 1 << 20, nil
}

func (k *countSink) count(tp runner.TP) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetched[tp]
}

// TestAssignAgainStartsUnpaused: a partition assigned again without a
// revoke (a rejoin that replaces the assignment) starts unpaused, as a
// new assignment does, and its records are handed over again from the
// committed offset.
func TestAssignAgainStartsUnpaused(t *testing.T) {
	src := runnertest.New()
	tp := runner.TP{Topic: "t", Partition: 0}
	src.Append(runner.Record{Topic: "t", Partition: 0, Offset: 0}, runner.Record{Topic: "t", Partition: 0, Offset: 1})
	sink := &countSink{fetched: map[runner.TP]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	defer func() { cancel(); <-done }()
	if err := src.Assign(ctx, tp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return sink.count(tp) == 2 })
	src.Pause([]runner.TP{tp})
	if err := src.Assign(ctx, tp); err != nil {
		t.Fatal(err)
	}
	if src.Paused(tp) {
		t.Errorf("%s still paused after it was assigned again", tp)
	}
	waitFor(t, func() bool { return sink.count(tp) == 4 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}
