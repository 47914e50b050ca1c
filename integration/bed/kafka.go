//go:build integration

package bed

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/kafkatest"
)

// StartHint is the sentence every failure caused by a missing or unreachable
// service ends with.
const StartHint = "start the test bed: scripts/testbed up && source .testbed/env"

// opTimeout bounds each call a helper makes, so a broken bed fails a
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
	return append([]kgo.Opt{kgo.SeedBrokers(Kafka(t)...)}, logOpts(t)...)
}

// logOpts log a client's requests as TIDEMARK_KGO_LOG says (none without).
func logOpts(t testing.TB) []kgo.Opt {
	var opts []kgo.Opt
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

// freshMetadata is the MetadataMinAge of Admin's client.
const freshMetadata = 100 * time.Millisecond

// Name returns a name unique to this call, made of prefix, the test's name
// and random hex, usable as a topic, group or transactional id.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	return kafkatest.Name(t, prefix)
}

// Group returns a consumer group id unique to this call. Groups are not
// deleted afterwards: a group with no members and no recent commits expires
// on its own, and the bed's data is thrown away by the next `up`.
func Group(t testing.TB) string {
	t.Helper()
	return Name(t, "group")
}

// Cluster returns a kafkatest.Cluster on the test bed (see Kafka), whose
// clients log as Client's do; they are closed in the test's cleanup. One
// Cluster serves conditions polled many times, where the functions below
// open a client per call.
func Cluster(t testing.TB) *kafkatest.Cluster {
	t.Helper()
	return kafkatest.New(t, Kafka(t), logOpts(t)...)
}

// Topic creates a topic with the given number of partitions (the broker's
// default replication: kafkatest.Cluster.CreateTopic)
// and a name unique to this call, waits until every partition has a leader,
// and deletes the topic in the test's cleanup.
func Topic(t testing.TB, partitions int) string {
	t.Helper()
	return Cluster(t).Topic(partitions)
}

// Produce writes n records to topic and returns when all are acknowledged
// (acks=all, idempotent). Record i has value strconv.Itoa(i) and key
// key(i); with a nil key func the records have no key. Records with the same
// key go to the same partition (Kafka's murmur2 partitioner, as the Java
// client), in the order of i.
func Produce(t testing.TB, topic string, n int, key func(i int) string) {
	t.Helper()
	Cluster(t).ProduceKeyed(topic, n, key)
}

// EndOffsets returns the high watermark of each partition of topic: the
// offset the next record will get. Transaction markers take offsets too, so
// after transactions the end offset is more than the number of records.
func EndOffsets(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	return Cluster(t).Ends(topic)
}

// Committed returns the offsets group has committed for each partition of
// topic, -1 for a partition with no commit. An offset is the next one to
// consume, so a group that consumed a whole partition has committed its end
// offset.
func Committed(t testing.TB, group, topic string) map[int32]int64 {
	t.Helper()
	return Cluster(t).Committed(group, topic)
}

// Member is one member of a consumer group as its coordinator describes it.
type Member = kafkatest.GroupMember

// Members describes group and returns its members sorted by MemberID; none
// when the group is empty or unknown. It asks with ConsumerGroupDescribe
// (KIP-848 groups) and falls back to DescribeGroups for classic groups.
func Members(t testing.TB, group string) []Member {
	t.Helper()
	return Cluster(t).Members(group)
}
