//go:build integration

package bed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// StartHint is the sentence every failure caused by a missing or unreachable
// service ends with.
const StartHint = "start the test bed: scripts/testbed up && source .testbed/env"

// opTimeout bounds each admin call a helper makes, so a broken bed fails a
// test instead of hanging it until go test's -timeout.
const opTimeout = 30 * time.Second

// kafkaOK holds the values of TIDEMARK_KAFKA_BROKERS that a broker answered
// on in this process, so the check runs once per test binary.
var kafkaOK struct {
	sync.Mutex
	answered map[string]bool
}

// Kafka returns the seed brokers of the test bed, from TIDEMARK_KAFKA_BROKERS
// (comma-separated host:port). The first call in a test binary also checks
// that a broker answers a metadata request. When the variable is missing or
// the broker does not answer, Kafka fails the test with t.Fatalf and a hint
// on how to start the bed; it never skips.
func Kafka(t testing.TB) []string {
	t.Helper()
	env := os.Getenv("TIDEMARK_KAFKA_BROKERS")
	if env == "" {
		t.Fatalf("bed: TIDEMARK_KAFKA_BROKERS is not set; %s", StartHint)
	}
	brokers := strings.Split(env, ",")

	kafkaOK.Lock()
	defer kafkaOK.Unlock()
	if kafkaOK.answered[env] {
		return brokers
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DialTimeout(3*time.Second), kgo.RequestRetries(2))
	if err != nil {
		t.Fatalf("bed: TIDEMARK_KAFKA_BROKERS=%q: %v; %s", env, err, StartHint)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err == nil && len(md.Brokers) == 0 {
		err = errors.New("metadata lists no broker")
	}
	if err != nil {
		t.Fatalf("bed: no Kafka broker answers at TIDEMARK_KAFKA_BROKERS=%q: %v; %s", env, err, StartHint)
	}
	if kafkaOK.answered == nil {
		kafkaOK.answered = make(map[string]bool)
	}
	kafkaOK.answered[env] = true
	return brokers
}

// Client returns a franz-go client on the test bed with opts added after the
// seed brokers. It is closed in the test's cleanup; closing it earlier is
// fine (a group member leaves its group on Close).
//
// With TIDEMARK_KGO_LOG=debug (or info, warn, error) in the environment the
// client logs through t.Logf at that level, for debugging a test.
func Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(clientOpts(t), opts...)...)
	if err != nil {
		t.Fatalf("bed: new kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// clientOpts are the options every client of the helpers starts with.
func clientOpts(t testing.TB) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(Kafka(t)...)}
	var level kgo.LogLevel
	switch strings.ToLower(os.Getenv("TIDEMARK_KGO_LOG")) {
	case "debug":
		level = kgo.LogLevelDebug
	case "info":
		level = kgo.LogLevelInfo
	case "warn":
		level = kgo.LogLevelWarn
	case "error":
		level = kgo.LogLevelError
	default:
		return opts
	}
	return append(opts, kgo.WithLogger(kgo.BasicLogger(testWriter{t}, level, func() string {
		return time.Now().Format("15:04:05.000 ")
	})))
}

// testWriter sends each log line to t.Logf.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("kgo: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Admin returns a kadm client on the test bed, closed in the test's cleanup.
// Its client refreshes metadata after 100ms instead of franz-go's default
// 5s, so right after a topic is created or deleted it sees the change.
func Admin(t testing.TB) *kadm.Client {
	t.Helper()
	return kadm.NewClient(Client(t, kgo.MetadataMinAge(freshMetadata)))
}

// freshMetadata is the MetadataMinAge of the helpers' own clients.
const freshMetadata = 100 * time.Millisecond

// Name returns a name unique to this call, made of prefix, the test's name
// and random hex, usable as a topic, group or transactional id.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("bed: random name: %v", err)
	}
	name := notNameChar.ReplaceAllString(t.Name(), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	return prefix + "-" + name + "-" + hex.EncodeToString(b[:])
}

var notNameChar = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// Group returns a consumer group id unique to this call. Groups are not
// deleted afterwards: a group with no members and no recent commits expires
// on its own, and the bed's data is thrown away by the next `up`.
func Group(t testing.TB) string {
	t.Helper()
	return Name(t, "group")
}

// Topic creates a topic with the given number of partitions (one replica)
// and a name unique to this call, waits until every partition has a leader,
// and deletes the topic in the test's cleanup.
func Topic(t testing.TB, partitions int) string {
	t.Helper()
	if partitions < 1 {
		t.Fatalf("bed: Topic needs at least one partition, got %d", partitions)
	}
	adm := Admin(t)
	topic := Name(t, "topic")
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("bed: create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		resp, err := adm.DeleteTopic(ctx, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Errorf("bed: delete topic %s: %v", topic, err)
		}
	})
	for {
		md, err := adm.Metadata(ctx, topic)
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
				// metadata refresh (5s by default). ListOffsets is answered
				// by the leader's replica manager, so it waits for that.
				var listed kadm.ListedOffsets
				listed, err = adm.ListEndOffsets(ctx, topic)
				if err == nil {
					err = listed.Error()
				}
				ready = err == nil
			}
			if ready {
				return topic
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("bed: topic %s: partitions have no leader after %v (last error: %v)", topic, opTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Produce writes n records to topic and returns when all are acknowledged
// (acks=all, idempotent). Record i has value strconv.Itoa(i) and key
// key(i); with a nil key func the records have no key. Records with the same
// key go to the same partition (Kafka's murmur2 partitioner, as the Java
// client), in the order of i.
func Produce(t testing.TB, topic string, n int, key func(i int) string) {
	t.Helper()
	cl, err := kgo.NewClient(append(clientOpts(t), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MetadataMinAge(freshMetadata))...)
	if err != nil {
		t.Fatalf("bed: new kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout+time.Duration(n)*time.Millisecond)
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
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
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
		t.Fatalf("bed: produce %d records to %s: flush: %v", n, topic, err)
	}
	if firstErr != nil {
		t.Fatalf("bed: produce %d records to %s: %v", n, topic, firstErr)
	}
}

// EndOffsets returns the high watermark of each partition of topic: the
// offset the next record will get. Transaction markers take offsets too, so
// after transactions the end offset is more than the number of records.
func EndOffsets(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	listed, err := Admin(t).ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("bed: end offsets of %s: %v", topic, err)
	}
	out := make(map[int32]int64)
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// Committed returns the offsets group has committed for each partition of
// topic, -1 for a partition with no commit. An offset is the next one to
// consume, so a group that consumed a whole partition has committed its end
// offset.
func Committed(t testing.TB, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := Admin(t).FetchOffsetsForTopics(ctx, group, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("bed: committed offsets of group %s on %s: %v", group, topic, err)
	}
	out := make(map[int32]int64)
	for p, o := range resp[topic] {
		out[p] = o.At
	}
	return out
}

// Member is one member of a consumer group as its coordinator describes it.
type Member struct {
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
func Members(t testing.TB, group string) []Member {
	t.Helper()
	adm := Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()

	var out []Member
	described, err := adm.DescribeConsumerGroups(ctx, group)
	if err == nil {
		err = described[group].Err
	}
	switch {
	case err == nil:
		for _, m := range described[group].Members {
			out = append(out, Member{
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
		classic, err := adm.DescribeGroups(ctx, group)
		if err == nil {
			err = classic.Error()
		}
		if err != nil {
			t.Fatalf("bed: describe group %s: %v", group, err)
		}
		for _, m := range classic[group].Members {
			assigned := make(map[string][]int32)
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, tp := range a.Topics {
					assigned[tp.Topic] = slices.Sorted(slices.Values(tp.Partitions))
				}
			}
			out = append(out, Member{
				MemberID:   m.MemberID,
				InstanceID: deref(m.InstanceID),
				ClientID:   m.ClientID,
				Protocol:   "classic",
				Assigned:   assigned,
			})
		}
	default:
		t.Fatalf("bed: describe consumer group %s: %v", group, err)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.MemberID, b.MemberID) })
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
