package franz_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestFirstPollRespectsHighWaterMark: the first poll is limited by the
// runner's budget like every later one; it used MaxPollRecords (500), which
// pushed a partition far past a lower high water mark (invariant 6).
func TestFirstPollRespectsHighWaterMark(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("fp", 1)
	produce(c, "fp", 1, 400, 400)
	release := make(chan struct{})
	h := func(ctx context.Context, rec runner.Record) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ctx.Err()
	}
	m := startMember(t, c, "g-fp", []string{"fp"}, h, nil,
		runner.WaterMarks(50, 10), runner.Concurrency(1), runner.CommitInterval(5*time.Millisecond))
	defer close(release)
	deadline := time.Now().Add(5 * time.Second)
	max := 0
	for time.Now().Before(deadline) {
		for _, p := range m.Runner.Stats().Partitions {
			if p.Buffered > max {
				max = p.Buffered
			}
		}
		if max > 0 {
			time.Sleep(100 * time.Millisecond)
			for _, p := range m.Runner.Stats().Partitions {
				if p.Buffered > max {
					max = p.Buffered
				}
			}
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if max > 50 {
		t.Fatalf("partition holds %d records, above the high water mark 50", max)
	}
}
