package runner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// orderCheck records, per lane key, whether a handler is running and the
// last offset handled, and reports the first violation of invariant 5.
type orderCheck struct {
	mu        sync.Mutex
	running   map[string]bool
	last      map[string]int64
	violation string
	handled   int
	maxPar    int
	par       int
}

func (c *orderCheck) enter(lane string, off int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[lane] && c.violation == "" {
		c.violation = fmt.Sprintf("lane %s: offset %d started while another record of the lane ran", lane, off)
	}
	if last, ok := c.last[lane]; ok && off <= last && c.violation == "" {
		c.violation = fmt.Sprintf("lane %s: offset %d ran after offset %d", lane, off, last)
	}
	c.running[lane] = true
	c.last[lane] = off
	c.par++
	c.maxPar = max(c.maxPar, c.par)
}

func (c *orderCheck) exit(lane string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[lane] = false
	c.handled++
	c.par--
}

func TestOrdering(t *testing.T) {
	const partitions, perPartition, keys = 4, 600, 20
	cases := []struct {
		name    string
		mode    runner.Ordering
		lane    func(runner.Record) string
		minPar  int // parallelism the mode must reach
		ordered bool
	}{
		{"key", runner.KeyOrder, func(r runner.Record) string { return fmt.Sprintf("%d/%s", r.Partition, r.Key) }, 8, true},
		{"partition", runner.PartitionOrder, func(r runner.Record) string { return fmt.Sprint(r.Partition) }, 2, true},
		{"unordered", runner.Unordered, func(r runner.Record) string { return fmt.Sprint(r.Offset, "/", r.Partition) }, 8, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := runnertest.New()
			fill(src, partitions, perPartition, keys)
			c := &orderCheck{running: map[string]bool{}, last: map[string]int64{}}
			h := func(ctx context.Context, rec runner.Record) error {
				lane := tc.lane(rec)
				c.enter(lane, rec.Offset)
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				c.exit(lane)
				return nil
			}
			r := newRunner(t, src, runner.Handle(topic, h), runner.Order(tc.mode),
				runner.Concurrency(16), runner.CommitInterval(5*time.Millisecond))
			started(t, r)
			assign(t, src, tp(0), tp(1), tp(2), tp(3))
			for p := range int32(partitions) {
				eventually(t, "all committed", committedAt(src, p, perPartition))
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.violation != "" {
				t.Fatal(c.violation)
			}
			if c.handled != partitions*perPartition {
				t.Fatalf("handled %d, want %d", c.handled, partitions*perPartition)
			}
			if c.maxPar < tc.minPar {
				t.Fatalf("at most %d handlers ran at once, want at least %d: the mode serializes too much", c.maxPar, tc.minPar)
			}
			if c.maxPar > 16 {
				t.Fatalf("%d handlers ran at once, above Concurrency(16)", c.maxPar)
			}
		})
	}
}
