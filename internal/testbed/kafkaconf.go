package testbed

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// kafkaMain is the broker's main class; with the path of its
// server.properties it marks the JVM as ours.
const kafkaMain = "kafka.Kafka"

func (n Broker) mark() mark { return mark{kafkaMain, n.Config} }

// serverProperties renders node n's server.properties for the cluster of
// nodes running Kafka version. The settings are docs/testbed.md's "Broker
// settings" (and docker-compose.yml mirrors them).
func serverProperties(version string, n Broker, nodes []Broker) []byte {
	var voters []string
	for _, o := range nodes {
		if hasRole(o, "controller") {
			voters = append(voters, fmt.Sprintf("127.0.0.1:%d", o.ControllerPort))
		}
	}
	listeners := fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", n.Port)
	if hasRole(n, "controller") {
		listeners += fmt.Sprintf(",CONTROLLER://127.0.0.1:%d", n.ControllerPort)
	}
	rf, isr := replication(nodes)
	var b bytes.Buffer
	fmt.Fprintf(&b, `# Written by the test bed (internal/testbed) when the node is set up.
process.roles=%s
node.id=%d
controller.quorum.bootstrap.servers=%s
listeners=%s
advertised.listeners=%s
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=%s
num.network.threads=2
num.io.threads=4

# Replication: one replica on one node; on a cluster three (one per broker
# when fewer) and two in sync for acks=all, for the internal topics and for
# topics created without a replication factor. Fewer partitions than the
# default 50 for the internal topics, so they are created quickly.
offsets.topic.replication.factor=%[7]d
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=%[7]d
transaction.state.log.min.isr=%[8]d
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=%[7]d
share.coordinator.state.topic.min.isr=%[8]d
num.partitions=1
default.replication.factor=%[7]d
min.insync.replicas=%[8]d

# Tests create their topics themselves.
auto.create.topics.enable=false

# Fast groups for tests. Classic protocol: no initial delay, and clients may
# ask for a session timeout down to 1s. Consumer protocol (KIP-848, on by
# default in 4.x): 1s heartbeats, 10s default session timeout, and groups may
# lower it to 1s (group config consumer.session.timeout.ms).
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=1000

# Share groups (KIP-932), as fast: 1s heartbeats, 10s session timeout, and
# groups may lower it to 1s (group config share.session.timeout.ms). The
# acquisition lock is 5s (Kafka: 30s) and groups may lower it to 1s (Kafka:
# 15s) with the group config share.record.lock.duration.ms, so a test of
# lock expiry takes seconds. The share-group state topic gets 10 partitions.
share.coordinator.state.topic.num.partitions=10
group.share.heartbeat.interval.ms=1000
group.share.min.heartbeat.interval.ms=500
group.share.session.timeout.ms=10000
group.share.min.session.timeout.ms=1000
group.share.record.lock.duration.ms=5000
group.share.min.record.lock.duration.ms=1000
`, strings.Join(n.Roles, ","), n.ID, strings.Join(voters, ","), listeners, listeners, n.Data, rf, isr)
	if shareVersion(version) >= 2 {
		b.WriteString(`
# The share groups' dead-letter queue (share.version 2, Kafka 4.4): a group
# names its DLQ with the group config errors.deadletterqueue.topic.name,
# which must start with the prefix below; the broker writes to it only if
# the topic has errors.deadletterqueue.group.enable=true. Tests create
# that topic themselves: the broker does not create it (Kafka's defaults,
# written out).
errors.deadletterqueue.topic.name.prefix=dlq.
errors.deadletterqueue.auto.create.topics.enable=false
`)
	}
	return b.Bytes()
}

// shareVersion is the level of the share.version feature the bed formats
// Kafka version with: 2 (share groups and their dead-letter queue) from
// 4.4, 1 (share groups) in 4.2 and 4.3, where they are generally
// available, and 0 (Kafka's default: off; a preview in 4.0 and 4.1)
// before. A version that does not parse counts as the newest.
func shareVersion(version string) int {
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return 2
	}
	switch {
	case major > 4 || major == 4 && minor >= 4:
		return 2
	case major == 4 && minor >= 2:
		return 1
	}
	return 0
}

// replication returns the replication factor and min.insync.replicas of a
// cluster of nodes: three replicas, or one per broker when there are
// fewer, and one less than that in sync (at least one): 3 and 2 on three
// brokers, 1 and 1 on one.
func replication(nodes []Broker) (rf, isr int) {
	brokers := 0
	for _, n := range nodes {
		if hasRole(n, "broker") {
			brokers++
		}
	}
	rf = min(3, max(brokers, 1))
	isr = min(2, max(rf-1, 1))
	return rf, isr
}

func hasRole(n Broker, role string) bool {
	for _, r := range n.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// jvmArgs are the java arguments before the main class, for a JVM that
// logs into logs.
func jvmArgs(k *KafkaState, logs string) []string {
	args := append([]string(nil), k.Heap...)
	if k.jit() == JITClient {
		args = append(args, "-XX:TieredStopAtLevel=1")
	}
	return append(args,
		"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+k.Log4j,
		"-Dkafka.logs.dir="+logs,
		// The JVM expands the wildcard itself: no shell is involved.
		"-cp", filepath.Join(k.Jars, "*"))
}

// brokerArgv is the command line of node n's broker.
func brokerArgv(k *KafkaState, n Broker) []string {
	return append(append([]string{k.Java}, jvmArgs(k, n.Logs)...), kafkaMain, n.Config)
}

// formatArgv is the command line that formats node n's storage: one node
// is the whole quorum (--standalone); in a cluster every controller is
// formatted with the same --initial-controllers, each voter's id, address
// and directory id, and a broker-only node with --no-initial-controllers.
func formatArgv(k *KafkaState, n Broker) []string {
	args := append([]string{k.Java}, jvmArgs(k, filepath.Join(n.Logs, "format"))...)
	args = append(args, "kafka.tools.StorageTool", "format", "-t", k.ClusterID, "-c", n.Config)
	if v := shareVersion(k.Version); v > 0 {
		// Said explicitly, so that a release without the level fails
		// the format instead of starting without share groups.
		args = append(args, "--feature", fmt.Sprintf("share.version=%d", v))
	}
	if len(k.Nodes) <= 1 {
		return append(args, "--standalone")
	}
	if !hasRole(n, "controller") {
		return append(args, "--no-initial-controllers")
	}
	var voters []string
	for _, o := range k.Nodes {
		if hasRole(o, "controller") {
			voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d:%s", o.ID, o.ControllerPort, o.DirID))
		}
	}
	return append(args, "--initial-controllers", strings.Join(voters, ","))
}

// newClusterID returns a cluster id as kafka-storage random-uuid makes
// them: 16 random bytes in unpadded URL-safe base64, never starting with
// '-' (the format command would read it as an option).
func newClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
		id := base64.RawURLEncoding.EncodeToString(b[:])
		if id[0] != '-' {
			return id
		}
	}
}

// javaVersion parses `java -version` output: the quoted version and its
// major number (8 for "1.8.0_392", 17 for "17.0.15"); 0 when none.
func javaVersion(out []byte) (string, int) {
	m := javaVersionRE.FindSubmatch(out)
	if m == nil {
		return "", 0
	}
	v := string(m[1])
	parts := strings.Split(v, ".")
	if parts[0] == "1" && len(parts) > 1 {
		parts = parts[1:]
	}
	digits := strings.FieldsFunc(parts[0], func(r rune) bool { return r < '0' || r > '9' })
	if len(digits) == 0 {
		return v, 0
	}
	major, _ := strconv.Atoi(digits[0])
	return v, major
}

var javaVersionRE = regexp.MustCompile(`version "([0-9][^"]*)"`)
