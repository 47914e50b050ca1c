//go:build integration

package integration_test

// Tests of the franz source adapter (pkg/source/franz) under a runner,
// against the test bed's real Kafka broker.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// franzMember is one runner over one spied franz Source on the test bed.
type franzMember struct {
	*kafkatest.Member
	src *franz.Source
}

func franzStart(t *testing.T, group, topic string, h runner.Handler, fopts []franz.Option, ropts ...runner.Option) *franzMember {
	t.Helper()
	fopts = append([]franz.Option{
		franz.Logger(kafkatest.Logger(t)),
		franz.SessionTimeout(6 * time.Second),
		franz.HeartbeatInterval(time.Second),
		franz.RebalanceTimeout(20 * time.Second),
	}, fopts...)
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, fopts...)
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	return &franzMember{Member: kafkatest.Start(t, "", src, 30*time.Second, append([]runner.Option{
		runner.Handle(topic, h),
		runner.Logger(kafkatest.Logger(t)),
		runner.CommitInterval(100 * time.Millisecond),
		runner.DrainBudget(5 * time.Second),
	}, ropts...)...), src: src}
}

func franzKey(i int) string { return fmt.Sprintf("key-%03d", i%256) }

// TestFranzConsumeAll: one runner consumes 20,000 keyed records from six
// partitions: every record is handled exactly once, each key's records in
// offset order, and the group commits the end offsets.
func TestFranzConsumeAll(t *testing.T) {
	t.Parallel()
	const n = 20_000
	topic, group := bed.Topic(t, 6), bed.Group(t)
	offs := bed.Cluster(t)
	bed.Produce(t, topic, n, franzKey)
	l := kafkatest.NewLedger()
	m := franzStart(t, group, topic, l.Handler("", nil), nil)
	kafkatest.WaitFor(t, 2*time.Minute, "every record handled", func() bool { return l.Count() >= n })
	kafkatest.WaitFor(t, 30*time.Second, "committed == end offsets", offs.AtEnd(group, topic))
	m.Stop(t)

	ends := bed.EndOffsets(t, topic)
	var total int64
	for _, end := range ends {
		total += end
	}
	if total != n {
		t.Fatalf("end offsets %v sum to %d, want %d", ends, total, n)
	}
	if err := l.ExactlyOnce(topic, ends); err != nil {
		t.Error(err)
	}
	if got := l.Count(); got != n {
		t.Errorf("%d handler calls, want exactly %d (one per record)", got, n)
	}
	if err := l.KeyOrder(); err != nil {
		t.Error(err)
	}
}

// TestFranzTwoMembers: a second member joins mid-stream and later the first
// one shuts down: every record is handled at least once, the group commits
// the end offsets, and no committed offset ever goes backward. It runs with
// cooperative rebalances (the default), eager ones, and static members
// (whose Close does not leave the group: the second member gets the
// partitions when the first one's session expires).
func TestFranzTwoMembers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		opts func(member string) []franz.Option
	}{
		{"cooperative", func(string) []franz.Option { return nil }},
		{"eager", func(string) []franz.Option { return []franz.Option{franz.Eager()} }},
		{"static", func(m string) []franz.Option { return []franz.Option{franz.InstanceID(m)} }},
		// KIP-848: the broker assigns (Kafka 4.x's consumer group protocol).
		{"kip848", func(string) []franz.Option { return []franz.Option{franz.ServerSideAssignment()} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			franzTwoMembers(t, tc.opts)
		})
	}
}

func franzTwoMembers(t *testing.T, opts func(member string) []franz.Option) {
	const chunks, per = 20, 1000
	topic, group := bed.Topic(t, 6), bed.Group(t)
	offs := bed.Cluster(t)
	sampler := offs.Sample(group, topic, 100*time.Millisecond)
	l := kafkatest.NewLedger()
	slow := func(member string) runner.Handler {
		return l.Handler(member, func(context.Context, runner.Record) error {
			time.Sleep(time.Millisecond)
			return nil
		})
	}
	a := franzStart(t, group, topic, slow("a"), opts("a"), runner.Concurrency(8))
	kafkatest.WaitFor(t, 30*time.Second, "the first member owns every partition", func() bool { return a.Spy.OwnedCount() == 6 })
	var b *franzMember
	for c := range chunks {
		bed.Produce(t, topic, per, func(i int) string { return franzKey(c*per + i) })
		switch c {
		case 6:
			b = franzStart(t, group, topic, slow("b"), opts("b"), runner.Concurrency(8))
		case 13:
			kafkatest.WaitFor(t, 30*time.Second, "both members own partitions", func() bool {
				return a.Spy.OwnedCount() > 0 && b.Spy.OwnedCount() > 0
			})
			a.Stop(t)
		}
		time.Sleep(100 * time.Millisecond)
	}
	kafkatest.WaitFor(t, 30*time.Second, "the second member owns every partition", func() bool { return b.Spy.OwnedCount() == 6 })
	kafkatest.WaitFor(t, 2*time.Minute, "committed == end offsets", offs.AtEnd(group, topic))
	time.Sleep(300 * time.Millisecond) // a few more samples
	b.Stop(t)
	sampler.Close()

	ends := bed.EndOffsets(t, topic)
	if err := l.AtLeastOnce(topic, ends); err != nil {
		t.Error(err)
	}
	if l.CountBy("a") == 0 || l.CountBy("b") == 0 {
		t.Errorf("members handled %d and %d records; want both > 0", l.CountBy("a"), l.CountBy("b"))
	}
	if back := sampler.Backward(); back != "" {
		t.Errorf("committed offset went backward: %s", back)
	}
	if errs := sampler.Errs(); len(errs) > 0 {
		t.Errorf("sampling committed offsets failed %d times, first: %v", len(errs), errs[0])
	}
	t.Logf("handled %d + %d records for %d; %d committed-offset changes sampled", l.CountBy("a"), l.CountBy("b"), chunks*per, sampler.Changes())
}

// TestFranzLost: a member is cut off the network (every connection closed,
// every dial refused) with a handler blocked on each of its partitions; it
// loses its session (franz-go reports the loss as soon as a heartbeat
// fails; the broker expires the member after the session timeout) and its
// partitions move to a second member, which finishes them and more records
// produced meanwhile. With the network back, the first member rejoined under
// a new member id and the lost handlers completing late, the first member
// never commits for those partitions again: the committed offsets stay at
// the end, never go back, and no commit after the loss carries its old
// member id; the lost handlers' contexts were cancelled.
func TestFranzLost(t *testing.T) {
	t.Parallel()
	const n, stuck = 2000, 20
	topic, group := bed.Topic(t, 2), bed.Group(t)
	offs := bed.Cluster(t)
	bed.Produce(t, topic, n, franzKey)
	sampler := offs.Sample(group, topic, 100*time.Millisecond)

	var (
		release  = make(chan struct{})
		mu       sync.Mutex
		blocked  = map[runner.TP]bool{}
		cancelOK = map[runner.TP]bool{} // the blocked handler saw its ctx end before release
		late     = map[runner.TP]bool{} // the blocked handler returned after release
	)
	l := kafkatest.NewLedger()
	hA := func(ctx context.Context, rec runner.Record) error {
		l.Add("a", rec)
		if rec.Offset != stuck {
			return nil
		}
		tp := rec.TP()
		mu.Lock()
		blocked[tp] = true
		mu.Unlock()
		<-release // ignores ctx on purpose: its completion arrives late
		mu.Lock()
		cancelOK[tp] = ctx.Err() != nil
		late[tp] = true
		mu.Unlock()
		return nil
	}
	sw := &netSwitch{}
	a := franzStart(t, group, topic, hA, []franz.Option{franz.ClientOptions(kgo.Dialer(sw.dial))})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // let Shutdown finish on a failure path
		}
	}()
	kafkatest.WaitFor(t, time.Minute, "the first member commits up to the blocked records", func() bool {
		got := offs.Committed(group, topic)
		return got[0] == stuck && got[1] == stuck
	})
	oldID, _ := a.src.Client().GroupMetadata()
	if oldID == "" {
		t.Fatal("the first member has no member id")
	}

	// What the member committed before the cut: the sampler may read it
	// only after the loss on a loaded machine, which is no commit after it.
	atCut := offs.Commits(group, topic)
	sw.cut()
	cutAt := time.Now()
	// Records the first member never sees: a commit of its own progress
	// after the loss would now move the committed offsets backward.
	bed.Produce(t, topic, n, franzKey)
	b := franzStart(t, group, topic, l.Handler("b", nil), nil)
	kafkatest.WaitFor(t, time.Minute, "the first member reports both partitions lost", func() bool { return len(a.Spy.LostAt()) == 2 })
	kafkatest.WaitFor(t, time.Minute, "the second member commits the end offsets", offs.AtEnd(group, topic))
	t.Logf("lost %v after the cut; the second member finished", time.Since(cutAt).Round(time.Millisecond))

	sw.restore()
	kafkatest.WaitFor(t, time.Minute, "the first member rejoins", func() bool {
		id, _ := a.src.Client().GroupMetadata()
		return id != "" && id != oldID
	})
	lostAt := time.Now()
	for _, at := range a.Spy.LostAt() {
		if at.Before(lostAt) {
			lostAt = at
		}
	}
	close(release)
	kafkatest.WaitFor(t, 10*time.Second, "the late completions", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(late) == 2
	})
	time.Sleep(3 * time.Second) // thirty commit intervals for a wrong commit to show

	ends := bed.EndOffsets(t, topic)
	got := bed.Committed(t, group, topic)
	for p, end := range ends {
		if got[p] != end {
			t.Errorf("partition %d committed %d after the late completions, want the end %d", p, got[p], end)
		}
	}
	sampler.Close()
	if back := sampler.Backward(); back != "" {
		t.Errorf("committed offset went backward: %s", back)
	}
	for p, h := range sampler.History() {
		for _, c := range h {
			if c.Metadata == oldID && c.At.After(lostAt) && (c.Offset != atCut[p].Offset || c.Metadata != atCut[p].Metadata) {
				t.Errorf("partition %d: commit of %d by the lost member %s at %v, after it was lost", p, c.Offset, oldID, c.At.Format(time.RFC3339Nano))
			}
		}
	}
	mu.Lock()
	for tp := range blocked {
		if !cancelOK[tp] {
			t.Errorf("%s: the lost partition's handler ctx was not cancelled", tp)
		}
	}
	mu.Unlock()

	a.Stop(t)
	b.Stop(t)
	if err := l.AtLeastOnce(topic, ends); err != nil {
		t.Error(err)
	}
	var ids []string
	for _, m := range bed.Members(t, group) {
		ids = append(ids, m.MemberID)
	}
	t.Logf("members left: [%s]", strings.Join(ids, " "))
}
