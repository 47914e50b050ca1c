package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// OpTimeout bounds each admin or produce call a helper makes, so a broken
// broker fails a test instead of hanging it until go test's -timeout.
const OpTimeout = 30 * time.Second

// freshMetadata is the MetadataMinAge of the helpers' clients: right after
// a topic is created or deleted they see the change (franz-go's default
// is 5s).
const freshMetadata = 100 * time.Millisecond

// Cluster is a test's view of a Kafka cluster: one franz-go client for
// admin requests and for producing records to the partition each names
// (kgo.ManualPartitioner), whatever the client under test, so the code
// under test is never its own witness. Its methods are safe for concurrent
// use, but those that fail the test must run on the test's goroutine.
type Cluster struct {
	// Fake is the in-process cluster of NewFake (for faults and control
	// functions); nil over a real broker.
	Fake *kfake.Cluster

	t       testing.TB
	brokers []string
	opts    []kgo.Opt
	cl      *kgo.Client
	adm     *kadm.Client
}

// New returns a Cluster over the brokers, its clients made with opts after
// the seed brokers; they are closed in the test's cleanup. New does not
// contact the brokers.
func New(t testing.TB, brokers []string, opts ...kgo.Opt) *Cluster {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(freshMetadata),
		kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: client: %v", err)
	}
	t.Cleanup(cl.Close)
	return &Cluster{t: t, brokers: brokers, opts: opts, cl: cl, adm: kadm.NewClient(cl)}
}

// NewFake starts an in-process kfake cluster of one broker that accepts
// session timeouts from 100ms, with opts added, and returns a Cluster over
// it; the cluster is closed in the test's cleanup.
func NewFake(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	fc, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: kfake: %v", err)
	}
	t.Cleanup(fc.Close) // registered first: runs after the client's Close
	c := New(t, fc.ListenAddrs())
	c.Fake = fc
	return c
}

// Brokers returns the seed brokers.
func (c *Cluster) Brokers() []string { return slices.Clone(c.brokers) }

// Client returns the Cluster's franz-go client, for raw requests and for
// producing from another goroutine (records go to the partition they name).
func (c *Cluster) Client() *kgo.Client { return c.cl }

// Admin returns the Cluster's kadm client.
func (c *Cluster) Admin() *kadm.Client { return c.adm }

// Name returns a name unique to this call, made of prefix, the test's name
// (its last 80 characters, where subtests differ) and random hex, usable as
// a topic, group or transactional id.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("kafkatest: random name: %v", err)
	}
	n := notNameChar.ReplaceAllString(t.Name(), "-")
	if len(n) > 80 {
		n = n[len(n)-80:]
	}
	return prefix + "-" + n + "-" + hex.EncodeToString(b[:])
}

var notNameChar = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// Topic creates a topic with a name unique to this call; see CreateTopic.
func (c *Cluster) Topic(partitions int) string {
	c.t.Helper()
	topic := Name(c.t, "topic")
	c.CreateTopic(topic, partitions)
	return topic
}

// CreateTopic creates topic with the given number of partitions and the
// broker's default replication factor (one on the bed of one node; three on
// its cluster, where a topic of one replica could never meet the
// min.insync.replicas of two that an acks=all write needs), waits until
// every partition has a leader that answers, and deletes the topic in the
// test's cleanup (a failed delete fails the test).
func (c *Cluster) CreateTopic(topic string, partitions int) {
	t := c.t
	t.Helper()
	if partitions < 1 {
		t.Fatalf("kafkatest: topic %s needs at least one partition, got %d", topic, partitions)
	}
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	resp, err := c.adm.CreateTopic(ctx, int32(partitions), -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
		defer cancel()
		resp, err := c.adm.DeleteTopic(ctx, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Errorf("kafkatest: delete topic %s: %v", topic, err)
		}
	})
	for {
		md, err := c.adm.Metadata(ctx, topic)
		if err == nil {
			td := md.Topics[topic]
			ready := td.Err == nil && len(td.Partitions) == partitions
			for _, p := range td.Partitions {
				ready = ready && p.Err == nil && p.Leader >= 0
			}
			if ready {
				// The metadata can name a leader a moment before that broker
				// serves the partition; a produce then fails with
				// NOT_LEADER_FOR_PARTITION and the client waits for its next
				// metadata refresh. ListOffsets is answered by the leader's
				// replica manager, so it waits for that.
				var listed kadm.ListedOffsets
				listed, err = c.adm.ListEndOffsets(ctx, topic)
				if err == nil {
					err = listed.Error()
				}
				ready = err == nil && len(listed[topic]) == partitions
			}
			if ready {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kafkatest: topic %s: partitions have no leader after %v (last error: %v)", topic, OpTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Produce writes recs, each to the partition it names (and the topic it
// names), and returns when every one is acknowledged.
func (c *Cluster) Produce(recs ...*kgo.Record) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	if err := c.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		c.t.Fatalf("kafkatest: produce %d records: %v", len(recs), err)
	}
}

// Spread returns per records for each of partitions of topic, for Produce:
// record i of partition p has value strconv.Itoa(i), a header "i" with the
// same value, and key key(p, i), or no key when key is nil.
func Spread(topic string, partitions int32, per int, key func(p int32, i int) string) []*kgo.Record {
	recs := make([]*kgo.Record, 0, int(partitions)*per)
	for p := range partitions {
		for i := range per {
			v := []byte(strconv.Itoa(i))
			r := &kgo.Record{Topic: topic, Partition: p, Value: v, Headers: []kgo.RecordHeader{{Key: "i", Value: v}}}
			if key != nil {
				r.Key = []byte(key(p, i))
			}
			recs = append(recs, r)
		}
	}
	return recs
}

// ProduceKeyed writes n records to topic and returns when all are
// acknowledged (acks=all, idempotent). Record i has value strconv.Itoa(i)
// and key key(i), or no key when key is nil. Records with the same key go
// to the same partition (Kafka's murmur2 partitioner, as the Java client),
// in the order of i.
func (c *Cluster) ProduceKeyed(topic string, n int, key func(i int) string) {
	t := c.t
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5 * time.Millisecond), kgo.MetadataMinAge(freshMetadata)}, c.opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: producer client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout+time.Duration(n)*time.Millisecond)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
	)
	for i := range n {
		r := &kgo.Record{Value: []byte(strconv.Itoa(i))}
		if key != nil {
			r.Key = []byte(key(i))
		}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("kafkatest: produce %d records to %s: flush: %v", n, topic, err)
	}
	if firstErr != nil {
		t.Fatalf("kafkatest: produce %d records to %s: %v", n, topic, firstErr)
	}
}

// Ends returns the end offset (high watermark) of each partition of topic:
// the offset the next record will get. Transaction markers take offsets
// too, so after transactions it is more than the number of records.
func (c *Cluster) Ends(topic string) map[int32]int64 {
	c.t.Helper()
	out, err := c.ends(topic)
	if err != nil {
		c.t.Fatalf("kafkatest: end offsets of %s: %v", topic, err)
	}
	return out
}

func (c *Cluster) ends(topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	listed, err := c.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// Committed returns group's committed offset of each partition of topic,
// -1 where there is none (also when the group is unknown).
func (c *Cluster) Committed(group, topic string) map[int32]int64 {
	c.t.Helper()
	out := map[int32]int64{}
	for p, o := range c.Commits(group, topic) {
		out[p] = o.Offset
	}
	return out
}

// Commits returns group's committed offset of each partition of topic with
// its metadata, as Committed reads them.
func (c *Cluster) Commits(group, topic string) map[int32]Commit {
	c.t.Helper()
	out, err := c.commits(group, topic)
	if err != nil {
		c.t.Fatalf("kafkatest: committed offsets of group %s on %s: %v", group, topic, err)
	}
	return out
}

// Commit is a group's committed offset of one partition.
type Commit struct {
	At       time.Time // when it was read
	Offset   int64
	Metadata string // the committing member's id, as franz-go writes it
}

func (c *Cluster) committed(group, topic string) (map[int32]int64, error) {
	full, err := c.commits(group, topic)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(full))
	for p, o := range full {
		out[p] = o.Offset
	}
	return out, nil
}

func (c *Cluster) commits(group, topic string) (map[int32]Commit, error) {
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	resp, err := c.adm.FetchOffsetsForTopics(ctx, group, topic)
	if err == nil {
		err = resp.Error()
	}
	now := time.Now()
	out := map[int32]Commit{}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// kfake (and a KIP-848 coordinator) answer so for a group that
		// never existed: it has committed nothing.
		ends, err := c.ends(topic)
		for p := range ends {
			out[p] = Commit{At: now, Offset: -1}
		}
		return out, err
	}
	if err != nil {
		return nil, err
	}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic {
			out[o.Partition] = Commit{At: now, Offset: o.At, Metadata: o.Metadata}
		}
	})
	return out, nil
}

// AtEnd returns a condition for WaitFor: group has committed the end
// offset of every partition of topic.
func (c *Cluster) AtEnd(group, topic string) func() bool {
	return func() bool {
		ends, got := c.Ends(topic), c.Committed(group, topic)
		for p, end := range ends {
			if got[p] != end {
				return false
			}
		}
		return true
	}
}

// ShareLags returns the share-partition lag of share group on each
// partition of topic (DescribeShareGroupOffsets): the records from the
// share-partition start offset to the end that are not acknowledged
// (accepted, rejected or archived); -1 where the group has no state for
// the partition yet. The start offset moves on lazily (on Kafka 4.4 it can
// stay 0 with every record accepted); the lag moves with each ack.
func (c *Cluster) ShareLags(group, topic string) map[int32]int64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	ends, err := c.ends(topic)
	if err != nil {
		c.t.Fatalf("kafkatest: end offsets of %s: %v", topic, err)
	}
	ds, err := c.adm.DescribeShareGroupOffsets(ctx, group)
	if err == nil {
		err = ds.Error()
	}
	if err != nil {
		c.t.Fatalf("kafkatest: share offsets of group %s: %v", group, err)
	}
	out := make(map[int32]int64, len(ends))
	for p := range ends {
		out[p] = -1
		if o, ok := ds[group].Offsets.Lookup(topic, p); ok && o.Err == nil {
			out[p] = o.Lag
		}
	}
	return out
}

// ShareAcked returns a condition for WaitFor: share group has acknowledged
// every record of every partition of topic (lag 0 everywhere).
func (c *Cluster) ShareAcked(group, topic string) func() bool {
	return func() bool {
		for _, lag := range c.ShareLags(group, topic) {
			if lag != 0 {
				return false
			}
		}
		return true
	}
}

// Evict removes a dynamic member from its group with a LeaveGroup request
// naming its member id (KIP-345's batch form, which an admin may send), as
// the coordinator does when a session expires: the member's next heartbeat
// or commit is answered UNKNOWN_MEMBER_ID, and its partitions go to the
// others. The member's process and connections stay up.
func (c *Cluster) Evict(group, memberID string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
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
		c.t.Fatalf("kafkatest: evict member %s from %s: %v", memberID, group, err)
	}
}

// GroupMember is one member of a consumer group as its coordinator
// describes it.
type GroupMember struct {
	MemberID   string
	InstanceID string // static membership id (KIP-345), "" without
	ClientID   string
	// Protocol is "consumer" for a member of a KIP-848 group (broker-side
	// assignment), "classic" for a JoinGroup/SyncGroup member.
	Protocol string
	// Assigned is the member's current assignment: topic → partitions,
	// sorted.
	Assigned map[string][]int32
}

// Members describes group and returns its members sorted by MemberID; none
// when the group is empty or unknown. It asks with ConsumerGroupDescribe
// (KIP-848 groups) and falls back to DescribeGroups for classic groups.
func (c *Cluster) Members(group string) []GroupMember {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), OpTimeout)
	defer cancel()
	var out []GroupMember
	described, err := c.adm.DescribeConsumerGroups(ctx, group)
	if err == nil {
		err = described[group].Err
	}
	switch {
	case err == nil:
		for _, m := range described[group].Members {
			out = append(out, GroupMember{
				MemberID:   m.MemberID,
				InstanceID: deref(m.InstanceID),
				ClientID:   m.ClientID,
				Protocol:   "consumer",
				Assigned:   sortedSet(m.Assignment),
			})
		}
	case errors.Is(err, kerr.GroupIDNotFound) || errors.Is(err, kerr.UnsupportedVersion):
		// Not a KIP-848 group (or unknown): ask the classic way. An unknown
		// group describes as Dead with no members.
		classic, err := c.adm.DescribeGroups(ctx, group)
		if err == nil {
			err = classic.Error()
		}
		if err != nil {
			t.Fatalf("kafkatest: describe group %s: %v", group, err)
		}
		for _, m := range classic[group].Members {
			assigned := make(map[string][]int32)
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, tp := range a.Topics {
					assigned[tp.Topic] = slices.Sorted(slices.Values(tp.Partitions))
				}
			}
			out = append(out, GroupMember{
				MemberID:   m.MemberID,
				InstanceID: deref(m.InstanceID),
				ClientID:   m.ClientID,
				Protocol:   "classic",
				Assigned:   assigned,
			})
		}
	default:
		t.Fatalf("kafkatest: describe consumer group %s: %v", group, err)
	}
	slices.SortFunc(out, func(a, b GroupMember) int { return strings.Compare(a.MemberID, b.MemberID) })
	return out
}

func sortedSet(s kadm.TopicsSet) map[string][]int32 {
	out := make(map[string][]int32, len(s))
	for topic, ps := range s {
		out[topic] = slices.Sorted(maps.Keys(ps))
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// WaitFor polls cond every 25ms until it holds, or fails the test naming
// what it waited for once timeout has passed.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Eventually polls cond every 25ms until it holds (true) or timeout passes
// (false).
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(25 * time.Millisecond)
	}
	return true
}
