package franz_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// holdCommit makes the cluster hold the next OffsetCommit of group until
// release is called, without stopping the rest of the cluster (kfake's
// SleepControl). held is closed once the commit is being held. release is
// safe to call more than once, and the test's cleanup calls it.
func holdCommit(t *testing.T, c *cluster, group string) (held <-chan struct{}, release func()) {
	t.Helper()
	heldCh, releaseCh := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(releaseCh) }) }
	t.Cleanup(release)
	var taken atomic.Bool
	c.c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if req.(*kmsg.OffsetCommitRequest).Group != group || !taken.CompareAndSwap(false, true) {
			c.c.KeepControl()
			return nil, nil, false
		}
		close(heldCh)
		c.c.SleepControl(func() { <-releaseCh })
		return nil, nil, false // the cluster answers it as usual once released
	})
	return heldCh, release
}

// TestSlowCommitDoesNotStallFetching: while the broker takes its time over
// a commit, records keep being fetched and handled. The adapter held the
// lock that guards ownership for the whole commit round trip and took the
// same lock before every poll, so one slow OffsetCommit stopped all
// fetching (issue 13: 1 of 20 records handled in 2 s while a commit was
// delayed by 3 s).
func TestSlowCommitDoesNotStallFetching(t *testing.T) {
	c := newCluster(t)
	c.topic(t, "t", 2)
	h := newHandled()
	// A commit on hold also holds the requests queued behind it on its
	// connection (heartbeats among them): a long session keeps the member
	// in the group meanwhile, and the commit timeout outlasts the test.
	startMember(t, c, "g", []string{"t"}, record(h),
		[]franz.Option{franz.SessionTimeout(30 * time.Second), franz.HeartbeatInterval(time.Second)},
		runner.CommitTimeout(time.Minute))
	// The commit of the first records is held.
	held, release := holdCommit(t, c, "g")
	c.produce(t, "t", 2, 1, 1)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the broker")
	}
	// One at a time, so that they take more than the poll that may have
	// been waiting already when the commit went out.
	for range 10 {
		c.produce(t, "t", 2, 1, 1)
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.count() < 22 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := h.count() - 2
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
	src, err := franz.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, franz.Logger(testLogger(t)))
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
