//go:build integration

package integration_test

// Every commit monotonic through a rebalance storm, checked by the spy
// (invariant 2).

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestCommitsNeverGoBackEachCommit: invariant 2 checked on every commit,
// not on samples. Members wrapped by spySource join and leave every
// 0.4–1 s for 5 s (longer on a loaded machine, up to 3 minutes, until the
// storm has made enough assignments and commits to test) while 20,000
// keyed records over six partitions are handled with random latency (and
// 20,000 more each time three quarters are handled before it has made
// enough). Each commit a member
// sends is checked against what it sent before in the same assignment,
// each acknowledged one against what was acknowledged before in the same
// assignment, and against the last acknowledged commit of the partition by
// any member. A committer that resent an older safe offset after a newer
// one (a late answer, a failure resetting the sequencer), or a final commit
// below the new owner's first, fails it, even if a later commit covered it
// before a 100 ms sample.
func TestCommitsNeverGoBackEachCommit(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const n, partitions = 20_000, 6
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	key := func(i int) string { return "key-" + strconv.Itoa(i%1000) }
	bed.Produce(t, topic, n, key)

	var handled atomic.Int64
	var storming atomic.Bool // slow handlers only while members come and go
	storming.Store(true)
	h := func(ctx context.Context, rec runner.Record) error {
		if storming.Load() {
			time.Sleep(time.Duration(rand.IntN(10_000)) * time.Microsecond)
		}
		handled.Add(1)
		return nil
	}
	watch := bed.Cluster(t).Sample(group, topic, 100*time.Millisecond) // the broker's view, sampled
	log := newSpyLog()
	var members []*kafkatest.Member
	k := 0
	add := func() {
		k++
		name := "m" + strconv.Itoa(k)
		src := &spySource{Source: franzSource(t, group, topic), name: name, log: log}
		members = append(members, runMember(t, name, src, topic, h, runner.Concurrency(8),
			runner.CommitInterval(20*time.Millisecond)))
	}
	for range 3 {
		add()
	}
	// The storm lasts 5 s, and longer while it has not yet made enough
	// assignments and commits to test (a loaded machine joins members
	// slowly), while records are left to handle, for at most 3 minutes.
	enough := func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return log.assignments >= 2*partitions && log.acked >= 200
	}
	joins, leaves := 3, 0
	stormEnd, stormLimit := time.Now().Add(5*time.Second), time.Now().Add(3*time.Minute)
	total := int64(n) // records produced
	for time.Now().Before(stormEnd) || (!enough() && time.Now().Before(stormLimit)) {
		if !enough() && handled.Load() >= total*3/4 {
			// A loaded machine commits less often per record: more
			// records, so that the storm runs on handlers still busy.
			bed.Produce(t, topic, n, key)
			total += n
		}
		time.Sleep(time.Duration(400+rand.IntN(600)) * time.Millisecond)
		if len(members) >= 3 || (len(members) > 1 && rand.IntN(2) == 0) {
			i := rand.IntN(len(members))
			members[i].Stop(t)
			members = append(members[:i], members[i+1:]...)
			leaves++
		} else {
			add()
			joins++
		}
	}
	stormHandled := handled.Load()
	storming.Store(false)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	for _, m := range members {
		m.Stop(t)
	}
	watch.Close()

	if back := watch.Backward(); back != "" {
		t.Error("sampled: committed offset went backward:", back)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, v := range log.violations {
		t.Error(v)
	}
	if log.assignments < 2*partitions || log.acked < 200 || stormHandled >= total {
		t.Fatalf("%d assignments, %d acknowledged commits, %d of %d records handled when the storm ended: too small a storm to test",
			log.assignments, log.acked, stormHandled, total)
	}
	t.Logf("%d joins, %d leaves, %d assignments; %d offsets sent, %d acknowledged, all checked; %d of %d records handled during the storm, %d handlings in all",
		joins, leaves, log.assignments, log.sent, log.acked, stormHandled, total, handled.Load())
}
