//go:build integration

package integration_test

// PartitionOrder across a real rebalance (invariant 5).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestPartitionOrderAcrossRebalance: PartitionOrder on the real broker
// (invariant 5). One member consumes four partitions with random handler
// latency; a second member joins mid-stream and the cooperative rebalance
// moves partitions to it while records are in flight. Across both members,
// never are two records of one partition running at once, and each
// partition's records start exactly in offset order, 0, 1, 2, ..., each
// once: the new owner starts where the old owner's drained final commit
// left off. A runner that dispatched a second record of a partition before
// the first finished, dispatched out of order, or a handoff that let the
// new owner start before the old one drained (or from the wrong offset),
// breaks one of these.
func TestPartitionOrderAcrossRebalance(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, partitions = 8000, 4
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "key-" + strconv.Itoa(i%64) })

	var (
		mu        sync.Mutex
		running   = map[int32]int{}            // partition → handlers running, all members
		seq       = map[int32][]int64{}        // partition → offsets in start order, all members
		by        = map[int32]map[string]int{} // partition → member → records
		violation string
		handled   atomic.Int64
	)
	h := func(name string) runner.Handler {
		return func(ctx context.Context, rec runner.Record) error {
			p := rec.Partition
			mu.Lock()
			if running[p]++; running[p] > 1 && violation == "" {
				violation = fmt.Sprintf("member %s started %s while another record of the partition ran", name, rec.String())
			}
			seq[p] = append(seq[p], rec.Offset)
			if by[p] == nil {
				by[p] = map[string]int{}
			}
			by[p][name]++
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			mu.Lock()
			running[p]--
			mu.Unlock()
			handled.Add(1)
			return nil
		}
	}
	log := newSpyLog()
	start := func(name string) *kafkatest.Member {
		src := &spySource{Source: franzSource(t, group, topic), name: name, log: log}
		return runMember(t, name, src, topic, h(name), runner.Order(runner.PartitionOrder), runner.Concurrency(8))
	}
	a := start("a")
	kafkatest.WaitFor(t, time.Minute, "a handles a tenth of the records", func() bool { return handled.Load() >= n/10 })
	b := start("b")
	kafkatest.WaitFor(t, time.Minute, "b owns partitions", func() bool { return log.ownedBy("b") > 0 })
	atJoin := handled.Load()
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	b.Stop(t)
	a.Stop(t)

	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	ends := bed.EndOffsets(t, topic)
	moved := 0
	for p := range int32(partitions) {
		s := seq[p]
		for i, off := range s {
			if off != int64(i) {
				t.Fatalf("partition %d: start %d was offset %d, want %d (out of order or replayed); around it: %v",
					p, i, off, i, s[max(0, i-3):min(len(s), i+3)])
			}
		}
		if int64(len(s)) != ends[p] {
			t.Fatalf("partition %d: %d records started, want %d", p, len(s), ends[p])
		}
		if by[p]["a"] > 0 && by[p]["b"] > 0 {
			moved++
		}
	}
	if moved == 0 || atJoin >= n {
		t.Fatalf("no partition moved mid-stream (handled per partition and member: %v; %d of %d handled when b got partitions): the handoff was not tested", by, atJoin, n)
	}
	t.Logf("%d partitions moved from a to b; %d of %d records handled when b got its first partition", moved, atJoin, n)
}
