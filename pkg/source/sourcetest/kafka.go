package sourcetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
)

// opTimeout bounds each admin call, so a broken broker fails a scenario
// instead of hanging it.
const opTimeout = 30 * time.Second

// cluster is a scenario's view of the broker: a franz-go client for admin
// requests and one for producing (records go to the partition they name). The suite uses franz-go for
// this whatever the adapter under test, so the adapter is never its own
// witness.
type cluster struct {
	t       *testing.T
	brokers []string
	cl      *kgo.Client
	adm     *kadm.Client
	prod    *kgo.Client
}

func newCluster(t *testing.T, brokers []string) *cluster {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatalf("sourcetest: admin client: %v", err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100*time.Millisecond),
		kgo.ProducerLinger(2*time.Millisecond), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		cl.Close()
		t.Fatalf("sourcetest: producer client: %v", err)
	}
	t.Cleanup(func() {
		prod.Close()
		cl.Close()
	})
	return &cluster{t: t, brokers: brokers, cl: cl, adm: kadm.NewClient(cl), prod: prod}
}

// name returns a name unique to this call: prefix, the test's name and
// random hex.
func name(t *testing.T, prefix string) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("sourcetest: random name: %v", err)
	}
	n := notNameChar.ReplaceAllString(t.Name(), "-")
	if len(n) > 80 {
		n = n[len(n)-80:]
	}
	return prefix + "-" + n + "-" + hex.EncodeToString(b[:])
}

var notNameChar = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// topic creates a topic with the given partitions (one replica), waits until
// every partition has a leader that answers, and deletes it in cleanup.
func (c *cluster) topic(partitions int) string {
	t := c.t
	t.Helper()
	topic := name(t, "topic")
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := c.adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("sourcetest: create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if resp, err := c.adm.DeleteTopic(ctx, topic); err != nil || resp.Err != nil {
			t.Logf("sourcetest: delete topic %s: %v %v", topic, err, resp.Err)
		}
	})
	for {
		listed, err := c.adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = listed.Error()
		}
		if err == nil && len(listed[topic]) == partitions {
			return topic
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sourcetest: topic %s has no leaders after %v: %v", topic, opTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// produce writes recs, each to the partition it names, and returns when
// every one is acknowledged.
func (c *cluster) produce(recs ...*kgo.Record) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		c.t.Fatalf("sourcetest: produce %d records: %v", len(recs), err)
	}
}

// ends returns the end offset (high watermark) of each partition of topic.
func (c *cluster) ends(topic string) map[int32]int64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	listed, err := c.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		c.t.Fatalf("sourcetest: end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// committed returns group's committed offset of each partition of topic,
// -1 where there is none.
func (c *cluster) committed(group, topic string) map[int32]int64 {
	c.t.Helper()
	out, err := c.fetchCommitted(group, topic)
	if err != nil {
		c.t.Fatalf("sourcetest: committed offsets of %s on %s: %v", group, topic, err)
	}
	return out
}

func (c *cluster) fetchCommitted(group, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := c.adm.FetchOffsetsForTopics(ctx, group, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) { out[o.Partition] = o.At })
	return out, nil
}

// atEnd reports whether group committed every partition's end offset.
func (c *cluster) atEnd(group, topic string) func() bool {
	return func() bool {
		ends, got := c.ends(topic), c.committed(group, topic)
		for p, e := range ends {
			if got[p] != e {
				return false
			}
		}
		return true
	}
}

// groupMember is one member of a classic consumer group as the
// coordinator describes it.
type groupMember struct {
	id         string
	instanceID string
}

// members describes a classic group; none when it is empty or unknown.
func (c *cluster) members(group string) []groupMember {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	described, err := c.adm.DescribeGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		c.t.Fatalf("sourcetest: describe group %s: %v", group, err)
	}
	var out []groupMember
	for _, m := range described[group].Members {
		gm := groupMember{id: m.MemberID}
		if m.InstanceID != nil {
			gm.instanceID = *m.InstanceID
		}
		out = append(out, gm)
	}
	return out
}

// evict removes a dynamic member from its group with a LeaveGroup request
// naming its member id (KIP-345's batch form, which an admin may send), as
// the coordinator does when a session expires: the member's next heartbeat
// or commit is answered UNKNOWN_MEMBER_ID, and its partitions go to the
// others. The member's process and connections stay up, so an adapter that
// kept committing would be caught.
func (c *cluster) evict(group, memberID string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = memberID
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, c.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err == nil && len(resp.Members) == 1 {
		err = kerr.ErrorForCode(resp.Members[0].ErrorCode)
	}
	if err != nil {
		c.t.Fatalf("sourcetest: evict member %s from %s: %v", memberID, group, err)
	}
}

// sampler polls a group's committed offsets every 50ms and keeps every
// change per partition, to catch one going backward (invariant 2).
type sampler struct {
	mu      sync.Mutex
	history map[int32][]int64
	errs    int
	stop    chan struct{}
	done    chan struct{}
}

func (c *cluster) sample(group, topic string) *sampler {
	s := &sampler{history: map[int32][]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			got, err := c.fetchCommitted(group, topic)
			s.mu.Lock()
			if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
				s.errs++
			}
			for p, off := range got {
				h := s.history[p]
				if off >= 0 && (len(h) == 0 || h[len(h)-1] != off) {
					s.history[p] = append(h, off)
				}
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	c.t.Cleanup(s.close)
	return s
}

func (s *sampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// backward describes the first committed offset that went backward, or "".
func (s *sampler) backward() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, h := range s.history {
		for i := 1; i < len(h); i++ {
			if h[i] < h[i-1] {
				return fmt.Sprintf("partition %d: committed %d after %d (history %v)", p, h[i], h[i-1], h)
			}
		}
	}
	return ""
}

func (s *sampler) changes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.history {
		n += len(h)
	}
	return n
}

// tpOf names partition p of topic.
func tpOf(topic string, p int32) runner.TP { return runner.TP{Topic: topic, Partition: p} }
