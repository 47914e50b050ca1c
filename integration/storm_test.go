//go:build integration

package integration_test

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

// TestRebalanceStorm: three members (then others) join and leave every few
// seconds while 200,000 keyed records over 12 partitions are handled with
// random latency. At the end every record was handled at least once, the
// committed offsets equal the end offsets, no committed offset went
// backward, no key ran twice at once within a member, and the first
// handling of each key's records happened in offset order (a commit that
// skipped an unfinished record, or a replay from the wrong place, breaks
// this or leaves a record unhandled).
func TestRebalanceStorm(t *testing.T) {
	const records, partitions, keys = 200_000, 12, 5_000
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, records, func(i int) string { return "key-" + strconv.Itoa(i%keys) })

	var (
		mu        sync.Mutex
		seen      = make([]bool, records)
		unique    int
		firstLast = map[string]int64{} // key → offset of its last first-time handling
		running   = map[string]int{}   // member/key → handlers running
		violation string
		total     atomic.Int64
	)
	fail := func(format string, a ...any) {
		if violation == "" {
			violation = fmt.Sprintf(format, a...)
		}
	}
	handler := func(name string) runner.Handler {
		return func(ctx context.Context, rec runner.Record) error {
			i, err := strconv.Atoi(string(rec.Value))
			if err != nil {
				return fmt.Errorf("record %s: bad value %q", rec.String(), rec.Value)
			}
			key := string(rec.Key)
			mk := name + "/" + key
			mu.Lock()
			if running[mk]++; running[mk] > 1 {
				fail("member %s ran key %s twice at once (offset %d)", name, key, rec.Offset)
			}
			if !seen[i] {
				if last, ok := firstLast[key]; ok && rec.Offset < last {
					fail("key %s: first handling of offset %d after offset %d", key, rec.Offset, last)
				}
				firstLast[key] = rec.Offset
				seen[i] = true
				unique++
			}
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(5001)) * time.Microsecond)
			mu.Lock()
			running[mk]--
			mu.Unlock()
			total.Add(1)
			return nil
		}
	}

	watch := bed.Cluster(t).Sample(group, topic, 100*time.Millisecond)

	var members []*kafkatest.Member
	n := 0
	add := func() {
		n++
		name := fmt.Sprintf("m%d", n)
		members = append(members, startMember(t, name, group, topic, handler(name), runner.Concurrency(64)))
	}
	for range 3 {
		add()
	}
	joins, leaves := 3, 0
	deadline := time.Now().Add(4 * time.Minute)
	for {
		mu.Lock()
		u := unique
		mu.Unlock()
		if u == records {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d records handled after 4 minutes", u, records)
		}
		time.Sleep(time.Duration(1500+rand.IntN(2000)) * time.Millisecond)
		// Churn: leave while three or more run, join while fewer than four.
		if len(members) >= 3 || (len(members) > 1 && rand.IntN(2) == 0) {
			k := rand.IntN(len(members))
			members[k].Stop(t)
			members = append(members[:k], members[k+1:]...)
			leaves++
		} else {
			add()
			joins++
		}
	}
	// Everything handled: the remaining members must commit the end.
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	for _, m := range members {
		m.Stop(t)
	}
	watch.Close()
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	if back := watch.Backward(); back != "" {
		t.Fatal("committed offset went backward:", back)
	}
	if watch.Polls() < 10 {
		t.Fatalf("only %d commit samples: the backward check saw too little", watch.Polls())
	}
	t.Logf("%d records, %d handlings (%d replays), %d joins, %d leaves, %d commit samples",
		records, total.Load(), total.Load()-records, joins, leaves, watch.Polls())
}
