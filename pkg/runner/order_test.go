package runner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
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
	t.Parallel()
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
			synctest.Test(t, func(t *testing.T) {
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
					await(t, time.Second, "all committed", committedAt(src, p, perPartition))
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
		})
	}
}

// TestNilKeysRunUnordered checks the nil-key rule of KeyOrder (options.go:
// "Records with a nil key have no key to order by and run as in
// Unordered") and that keyed records around them stay ordered.
//
// The partition starts with a record of key "a" (offset 0) and two nil-key
// records (1 and 2). Offset 0 returns only once 1 and 2 are both running,
// and each of 1 and 2 returns only once the other is running: so the test
// finishes only if nil-key records run at the same time as each other and
// as a keyed record that precedes them. If nil keys shared one lane, or
// joined the lane of the key before them, or the partition's, the barrier
// would never fill and the test fails after 5 s (of fake time). An empty key ([]byte{}) is
// a key, not a nil one: its records must stay ordered like any other key.
//
// The rest of the partition mixes keyed, empty-key and nil-key records
// under random latency: each key (including the empty one) runs one at a
// time in offset order, nil-key records overlap each other, and everything
// is committed.
func TestNilKeysRunUnordered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, keys = 600, 4
		src := runnertest.New()
		key := func(off int) []byte {
			switch {
			case off == 0:
				return []byte("a")
			case off == 1 || off == 2:
				return nil
			case off%3 == 0:
				return nil
			case off%7 == 0:
				return []byte{} // empty, not nil: an ordinary key
			}
			return []byte(fmt.Sprintf("k%d", off%keys))
		}
		recs := make([]runner.Record, n)
		for i := range n {
			recs[i] = runner.Record{Topic: topic, Partition: 0, Offset: int64(i), Key: key(i), Value: []byte("v")}
		}
		src.Append(recs...)

		var (
			mu         sync.Mutex
			running    = map[string]bool{}  // keyed lane → running
			last       = map[string]int64{} // keyed lane → last offset started
			nilRunning int
			nilMaxPar  int
			violation  string
			handled    int
			barrier    = map[int64]bool{} // which of offsets 1 and 2 started
			bothNil    = make(chan struct{})
		)
		fail := func(format string, a ...any) {
			if violation == "" {
				violation = fmt.Sprintf(format, a...)
			}
		}
		waitBoth := func(ctx context.Context, off int64) error {
			select {
			case <-bothNil:
				return nil
			case <-time.After(5 * time.Second):
				mu.Lock()
				fail("offset %d: nil-key offsets 1 and 2 were not both running within 5s (started: %v): nil-key records were serialized", off, barrier)
				mu.Unlock()
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		h := func(ctx context.Context, rec runner.Record) error {
			mu.Lock()
			if rec.Key == nil {
				nilRunning++
				nilMaxPar = max(nilMaxPar, nilRunning)
				if rec.Offset == 1 || rec.Offset == 2 {
					barrier[rec.Offset] = true
					if len(barrier) == 2 {
						close(bothNil)
					}
				}
			} else {
				lane := "key:" + string(rec.Key)
				if running[lane] {
					fail("%s: offset %d started while another record of the key ran", lane, rec.Offset)
				}
				if l, ok := last[lane]; ok && rec.Offset <= l {
					fail("%s: offset %d ran after offset %d", lane, rec.Offset, l)
				}
				running[lane], last[lane] = true, rec.Offset
			}
			mu.Unlock()

			if rec.Offset <= 2 {
				if err := waitBoth(ctx, rec.Offset); err != nil {
					return err
				}
			} else {
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
			}

			mu.Lock()
			if rec.Key == nil {
				nilRunning--
			} else {
				running["key:"+string(rec.Key)] = false
			}
			handled++
			mu.Unlock()
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.KeyOrder),
			runner.Concurrency(16), runner.CommitInterval(5*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "all committed", committedAt(src, 0, n))

		mu.Lock()
		defer mu.Unlock()
		if violation != "" {
			t.Fatal(violation)
		}
		if handled != n {
			t.Fatalf("handled %d, want %d", handled, n)
		}
		if nilMaxPar < 2 {
			t.Fatalf("at most %d nil-key records ran at once: nil keys were serialized", nilMaxPar)
		}
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}
