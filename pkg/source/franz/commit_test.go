package franz_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// holdCommit makes the cluster hold the next OffsetCommit of group until
// release is called, without stopping the rest of the cluster (kfake's
// SleepControl). held is closed once the commit is being held. release is
// safe to call more than once, and the test's cleanup calls it.
func holdCommit(t *testing.T, c *kafkatest.Cluster, group string) (held <-chan struct{}, release func()) {
	t.Helper()
	heldCh, releaseCh := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(releaseCh) }) }
	t.Cleanup(release)
	var taken atomic.Bool
	c.Fake.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if req.(*kmsg.OffsetCommitRequest).Group != group || !taken.CompareAndSwap(false, true) {
			c.Fake.KeepControl()
			return nil, nil, false
		}
		close(heldCh)
		c.Fake.SleepControl(func() { <-releaseCh })
		return nil, nil, false // the cluster answers it as usual once released
	})
	return heldCh, release
}

// TestSlowCommitDoesNotStallFetching: while the broker takes its time over
// a commit, records keep being fetched and handled. The adapter held the
// lock that guards ownership for the whole commit round trip and took the
// same lock before every poll, so one slow OffsetCommit stopped all
// fetching (before: 1 of 20 records handled in 2 s while a commit was
// delayed by 3 s).
func TestSlowCommitDoesNotStallFetching(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	l := kafkatest.NewLedger()
	// A commit on hold also holds the requests queued behind it on its
	// connection (heartbeats among them): a long session keeps the member
	// in the group meanwhile, and the commit timeout outlasts the test.
	startMember(t, c, "g", []string{"t"}, l.Handler("", nil),
		[]franz.Option{franz.SessionTimeout(30 * time.Second), franz.HeartbeatInterval(time.Second)},
		runner.CommitTimeout(time.Minute))
	// The commit of the first records is held.
	held, release := holdCommit(t, c, "g")
	produce(c, "t", 2, 1, 1)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the broker")
	}
	// One at a time, so that they take more than the poll that may have
	// been waiting already when the commit went out.
	for range 10 {
		produce(c, "t", 2, 1, 1)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Count() < 22 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := l.Count() - 2
	release()
	if got < 20 {
		t.Fatalf("%d of 20 records handled in 5s while a commit was held at the broker: the poll waited for the commit", got)
	}
}

// commitRequest is an OffsetCommit request of member for tps, as franz-go
// builds it.
func commitRequest(member string, tps ...runner.TP) *kmsg.OffsetCommitRequest {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.MemberID, req.Generation = "g", member, 1
	for _, tp := range tps {
		i := slices.IndexFunc(req.Topics, func(t kmsg.OffsetCommitRequestTopic) bool { return t.Topic == tp.Topic })
		if i < 0 {
			t := kmsg.NewOffsetCommitRequestTopic()
			t.Topic = tp.Topic
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
		}
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = tp.Partition, 10
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, p)
	}
	return req
}

func requestTPs(req *kmsg.OffsetCommitRequest) []runner.TP {
	var tps []runner.TP
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			tps = append(tps, runner.TP{Topic: t.Topic, Partition: p.Partition})
		}
	}
	return tps
}

// TestLostWaitsForSentCommit: the ownership check of a commit runs when the
// client issues the request, with the member id it carries; a loss waits
// for every commit already issued for its partitions to be answered before
// it reaches the runner, and no commit for them is let through after it. So
// after Lost not even a commit that was already on its way can be
// committed later (invariant 4 at the broker) — without a lock held across
// the commit's round trip.
func TestLostWaitsForSentCommit(t *testing.T) {
	t.Parallel()
	src, err := franz.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	p0, p1, p2 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}, runner.TP{Topic: "t", Partition: 2}
	src.Own(p0, "m")
	src.Own(p1, "m")
	src.Own(p2, "old")
	synctest.Test(t, func(t *testing.T) {
		req := commitRequest("m", p0, p1, p2)
		answered, refused := src.Admit(req)
		if got := requestTPs(req); !slices.Equal(got, []runner.TP{p0, p1}) || !slices.Equal(refused, []runner.TP{p2}) {
			t.Fatalf("admitted %v, refused %v; want %v admitted and %v (assigned under an earlier member id) refused", got, refused, []runner.TP{p0, p1}, p2)
		}
		var lost atomic.Bool
		go func() {
			src.Lose([]runner.TP{p0})
			lost.Store(true)
		}()
		synctest.Wait()
		if lost.Load() {
			t.Fatal("the loss returned while a commit naming the partition was still unanswered")
		}
		answered()
		synctest.Wait()
		if !lost.Load() {
			t.Fatal("the loss did not return once the commit was answered")
		}

		req = commitRequest("m", p0, p1)
		answered, refused = src.Admit(req)
		if got := requestTPs(req); !slices.Equal(got, []runner.TP{p1}) || !slices.Equal(refused, []runner.TP{p0}) {
			t.Fatalf("after the loss: admitted %v, refused %v; want %v admitted and %v refused", got, refused, p1, p0)
		}
		// A commit that names none of the lost partitions does not hold a
		// loss up.
		src.Own(p2, "m")
		var otherLost atomic.Bool
		go func() {
			src.Lose([]runner.TP{p2})
			otherLost.Store(true)
		}()
		synctest.Wait()
		if !otherLost.Load() {
			t.Fatal("a loss of another partition waited for the commit")
		}
		answered()
		if _, refused := src.Admit(commitRequest("m", p0, p2)); len(refused) != 2 {
			t.Fatalf("a commit of lost partitions only: refused %v, want both", refused)
		}
	})
}

// refusedOffsetFetch is the coordinator's answer to r that refuses it,
// and each group it names, with GROUP_AUTHORIZATION_FAILED.
func refusedOffsetFetch(r *kmsg.OffsetFetchRequest) *kmsg.OffsetFetchResponse {
	resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
	resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
	for _, g := range r.Groups {
		rg := kmsg.NewOffsetFetchResponseGroup()
		rg.Group, rg.ErrorCode = g.Group, kerr.GroupAuthorizationFailed.Code
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}

// TestRejoinNeverCommitsBackward: a member removed from the group that
// rejoins under a new member id and keeps its partition reads the group's
// committed offset to start from it. When that read fails, it goes on from
// its own position; another member may have committed further in between,
// and the rejoined member's commits must not move the group's offset back
// (they did, before the fix).
func TestRejoinNeverCommitsBackward(t *testing.T) {
	t.Parallel()
	const records, ahead = 2000, 1900
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	// Small batches and small fetches: the member's own position stays
	// far behind the offset another member commits.
	for range records / 10 {
		produce(c, "t", 1, 10, 10)
	}
	tp := runner.TP{Topic: "t", Partition: 0}
	var l hookLog
	slow := func(ctx context.Context, _ runner.Record) error {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}
	// A cooperative member heartbeats once half a second into each
	// session, whatever its interval. Evicted before that heartbeat, the
	// member can learn of it from the heartbeat rather than a commit.
	// The test counts heartbeats and evicts only after the first.
	var heartbeats atomic.Int32
	c.Fake.ControlKey(int16(kmsg.Heartbeat), func(kmsg.Request) (kmsg.Response, error, bool) {
		heartbeats.Add(1)
		return nil, nil, false
	})
	m := startMember(t, c, "g", []string{"t"}, slow,
		// The member must learn of its eviction from a commit, which
		// rejoins and keeps the partition; a heartbeat answered
		// UNKNOWN_MEMBER_ID first ends the session instead, the client
		// then reads the committed offsets itself, and the read this test
		// fails is the client's (a fatal authorization error), not the
		// source's. With the heartbeat minutes apart, and the eviction
		// after the early heartbeat counted above, none lands in that
		// window, however slowly a loaded machine gets to the eviction.
		[]franz.Option{franz.SessionTimeout(3 * time.Minute), franz.HeartbeatInterval(170 * time.Second),
			franz.ClientOptions(kgo.FetchMaxBytes(2000), kgo.FetchMaxPartitionBytes(2000))},
		runner.OnAssign(runner.PerPartition(l.hook)), runner.CommitInterval(5*time.Millisecond),
		runner.Concurrency(1), runner.WaterMarks(40, 20))
	kafkatest.WaitFor(t, 20*time.Second, "the first assignment, its first heartbeat and some commits", func() bool {
		return len(l.all()) == 1 && heartbeats.Load() >= 1 && c.Committed("g", tp.Topic)[tp.Partition] >= 20
	})
	oldID, _ := m.src.Client().GroupMetadata()

	// Hold the member's rejoin at the broker while another consumer
	// commits further, then fail the read of the committed offsets the
	// rejoin makes.
	joinHeld, releaseJoin := make(chan struct{}), make(chan struct{})
	var joinTaken atomic.Bool
	c.Fake.ControlKey(int16(kmsg.JoinGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !joinTaken.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		close(joinHeld)
		c.Fake.SleepControl(func() { <-releaseJoin })
		return nil, nil, false
	})
	defer func() {
		select {
		case <-releaseJoin:
		default:
			close(releaseJoin)
		}
	}()
	c.Evict("g", oldID)
	select {
	case <-joinHeld:
	case <-time.After(10 * time.Second):
		t.Fatal("the member did not rejoin")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: "t", Partition: 0, At: ahead, LeaderEpoch: -1})
	if resp, err := c.Admin().CommitOffsets(ctx, "g", os); err != nil || resp.Error() != nil {
		t.Fatalf("committing %d as another consumer: %v %v", ahead, err, resp.Error())
	}
	// Every read fails for longer than the source tries again
	// (rejoinReadFor, 5s): the rejoin gives up on it.
	var failedReads atomic.Int32
	failUntil := time.Now().Add(8 * time.Second)
	c.Fake.ControlKey(int16(kmsg.OffsetFetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if time.Now().After(failUntil) {
			return nil, nil, false
		}
		c.Fake.KeepControl()
		failedReads.Add(1)
		return refusedOffsetFetch(kreq.(*kmsg.OffsetFetchRequest)), nil, true
	})
	close(releaseJoin)

	kafkatest.WaitFor(t, 20*time.Second, "the partition assigned again under a new member id", func() bool {
		all := l.all()
		return len(all) >= 2 && all[len(all)-1].Member != oldID
	})
	if failedReads.Load() < 2 {
		t.Fatalf("%d reads of the committed offsets failed, want the rejoin's first and the ones it tried again", failedReads.Load())
	}
	if again := l.all()[1]; again.Start >= 0 {
		t.Fatalf("the rejoined assignment starts at %d: the read of the committed offsets did not fail", again.Start)
	}
	// 2,000 records one at a time, a millisecond each, in fetches of 2,000
	// bytes: seconds alone, and more than 20 on a loaded machine under
	// -race. What the test checks, that the commit never goes back, is
	// checked at every read.
	const within = 2 * time.Minute
	// The test's own reads of the group's offsets fail meanwhile too.
	time.Sleep(time.Until(failUntil))
	deadline := time.Now().Add(within)
	for {
		got := c.Committed("g", tp.Topic)[tp.Partition]
		if got < ahead {
			t.Fatalf("the group's committed offset went back from %d to %d after the rejoin", ahead, got)
		}
		if got == records {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed %d after %v, want %d", got, within, records)
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.Stop(t)
}
