package testbed_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/testbed"
)

// properties parses a .properties file as the broker reads it (no
// continuation lines: we write none).
func properties(t *testing.T, b []byte) map[string]string {
	t.Helper()
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("line %q is not key=value", l)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("%s is set twice", k)
		}
		m[k] = v
	}
	return m
}

// TestServerProperties: every setting of docs/testbed.md's "Broker
// settings", with the node's own ports and data directory, and nothing
// else: on 4.4 with the share groups' dead-letter queue, before 4.4
// without it.
func TestServerProperties(t *testing.T) {
	n := testbed.Broker{ID: 1, Roles: []string{"broker", "controller"}, Port: 36092, ControllerPort: 36093, Data: "/bed/kafka/node-1/data"}
	want := map[string]string{
		"process.roles":                       "broker,controller",
		"node.id":                             "1",
		"controller.quorum.bootstrap.servers": "127.0.0.1:36093",
		"listeners":                           "PLAINTEXT://127.0.0.1:36092,CONTROLLER://127.0.0.1:36093",
		"advertised.listeners":                "PLAINTEXT://127.0.0.1:36092,CONTROLLER://127.0.0.1:36093",
		"controller.listener.names":           "CONTROLLER",
		"inter.broker.listener.name":          "PLAINTEXT",
		"listener.security.protocol.map":      "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                            "/bed/kafka/node-1/data",
		"num.network.threads":                 "2",
		"num.io.threads":                      "4",

		"offsets.topic.replication.factor":                 "1",
		"offsets.topic.num.partitions":                     "10",
		"transaction.state.log.replication.factor":         "1",
		"transaction.state.log.min.isr":                    "1",
		"transaction.state.log.num.partitions":             "10",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
		"num.partitions":                                   "1",
		"default.replication.factor":                       "1",
		"min.insync.replicas":                              "1",
		"auto.create.topics.enable":                        "false",
		"group.initial.rebalance.delay.ms":                 "0",
		"group.min.session.timeout.ms":                     "1000",
		"group.consumer.heartbeat.interval.ms":             "1000",
		"group.consumer.min.heartbeat.interval.ms":         "500",
		"group.consumer.session.timeout.ms":                "10000",
		"group.consumer.min.session.timeout.ms":            "1000",

		"share.coordinator.state.topic.num.partitions": "10",
		"group.share.heartbeat.interval.ms":            "1000",
		"group.share.min.heartbeat.interval.ms":        "500",
		"group.share.session.timeout.ms":               "10000",
		"group.share.min.session.timeout.ms":           "1000",
		"group.share.record.lock.duration.ms":          "5000",
		"group.share.min.record.lock.duration.ms":      "1000",
	}
	dlq := map[string]string{
		"errors.deadletterqueue.topic.name.prefix":         "dlq.",
		"errors.deadletterqueue.auto.create.topics.enable": "false",
	}
	for _, c := range []struct {
		version string
		want    map[string]string
	}{
		{"4.1.1", want},
		{"4.3.1", want},
		{"4.4.0", union(want, dlq)},
		{"5.0.0", union(want, dlq)},
	} {
		got := properties(t, testbed.ServerProperties(c.version, n, []testbed.Broker{n}))
		if maps.Equal(got, c.want) {
			continue
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", c.version, k, got[k], v)
			}
		}
		for k := range got {
			if _, ok := c.want[k]; !ok {
				t.Errorf("%s: unexpected %s = %q", c.version, k, got[k])
			}
		}
	}
}

func union(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// TestServerPropertiesCluster: the rendering is per node over the cluster,
// so several nodes get their own id, listeners and data, and one quorum.
func TestServerPropertiesCluster(t *testing.T) {
	var nodes []testbed.Broker
	for i := range 3 {
		nodes = append(nodes, testbed.Broker{ID: int32(i + 1), Roles: []string{"broker", "controller"},
			Port: 100 + 2*i, ControllerPort: 101 + 2*i, Data: "/d" + string(rune('1'+i))})
	}
	for _, n := range nodes {
		p := properties(t, testbed.ServerProperties("4.4.0", n, nodes))
		if p["controller.quorum.bootstrap.servers"] != "127.0.0.1:101,127.0.0.1:103,127.0.0.1:105" {
			t.Errorf("node %d: quorum %q", n.ID, p["controller.quorum.bootstrap.servers"])
		}
		// Three replicas, two in sync: for created topics and the
		// internal ones.
		for k, v := range map[string]string{
			"default.replication.factor": "3", "min.insync.replicas": "2",
			"offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
			"transaction.state.log.min.isr": "2", "share.coordinator.state.topic.replication.factor": "3",
			"share.coordinator.state.topic.min.isr": "2",
		} {
			if p[k] != v {
				t.Errorf("node %d: %s = %q, want %s", n.ID, k, p[k], v)
			}
		}
		if p["node.id"] != strconv.Itoa(int(n.ID)) || p["log.dirs"] != n.Data || !strings.HasPrefix(p["listeners"], "PLAINTEXT://127.0.0.1:"+strconv.Itoa(n.Port)+",") {
			t.Errorf("node %d: %v", n.ID, p)
		}
	}
	// A broker-only node has no controller listener and is not a voter.
	b := testbed.Broker{ID: 4, Roles: []string{"broker"}, Port: 200, ControllerPort: 201}
	p := properties(t, testbed.ServerProperties("4.4.0", b, append(nodes, b)))
	if p["listeners"] != "PLAINTEXT://127.0.0.1:200" || strings.Contains(p["controller.quorum.bootstrap.servers"], ":201") {
		t.Errorf("broker-only node: %v", p)
	}
	// Two brokers: two replicas, one in sync.
	p = properties(t, testbed.ServerProperties("4.4.0", nodes[0], nodes[:2]))
	if p["default.replication.factor"] != "2" || p["min.insync.replicas"] != "1" || p["transaction.state.log.min.isr"] != "1" {
		t.Errorf("two nodes: replication %q, min.insync.replicas %q", p["default.replication.factor"], p["min.insync.replicas"])
	}
}

// TestFormatCluster: every controller of a cluster is formatted with the
// same --initial-controllers (each voter's id, controller address and
// directory id), a broker-only node with --no-initial-controllers, and
// none with --standalone, which would make each node a quorum of its own.
func TestFormatCluster(t *testing.T) {
	var nodes []testbed.Broker
	for i := range 3 {
		nodes = append(nodes, testbed.Broker{ID: int32(i + 1), Roles: []string{"broker", "controller"},
			ControllerPort: 101 + 10*i, DirID: "dir" + strconv.Itoa(i+1), Config: "/c" + strconv.Itoa(i+1)})
	}
	k := &testbed.KafkaState{Version: "4.4.0", ClusterID: "id", Java: "java", Nodes: nodes}
	want := "1@127.0.0.1:101:dir1,2@127.0.0.1:111:dir2,3@127.0.0.1:121:dir3"
	for _, n := range nodes {
		f := testbed.FormatArgv(k, n)
		i := slices.Index(f, "--initial-controllers")
		if i < 0 || i+1 == len(f) || f[i+1] != want || slices.Contains(f, "--standalone") {
			t.Errorf("node %d: format argv %q, want --initial-controllers %s and no --standalone", n.ID, f, want)
		}
	}
	b := testbed.Broker{ID: 4, Roles: []string{"broker"}}
	k.Nodes = append(k.Nodes, b)
	if f := testbed.FormatArgv(k, b); !slices.Contains(f, "--no-initial-controllers") || slices.Contains(f, "--standalone") {
		t.Errorf("broker-only node: format argv %q", f)
	}
}

// TestPlanNodes: node N's ports are the first node's plus
// NodePortStep*(N-1), each controller gets a directory id of its own, and
// a layout whose ports collide (with each other or PostgreSQL) or leave
// the port range is refused, naming the ports.
func TestPlanNodes(t *testing.T) {
	ns, err := testbed.PlanNodes("/bed", testbed.NewPorts(52100, 52101, 52432), 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	ids := map[string]bool{}
	for _, n := range ns {
		got = append(got, fmt.Sprintf("%d:%d/%d:%s", n.ID, n.Port, n.ControllerPort, n.Config))
		if n.DirID == "" || ids[n.DirID] {
			t.Errorf("node %d: directory id %q (empty or not unique)", n.ID, n.DirID)
		}
		ids[n.DirID] = true
	}
	want := []string{"1:52100/52101:/bed/kafka/node-1/server.properties", "2:52110/52111:/bed/kafka/node-2/server.properties",
		"3:52120/52121:/bed/kafka/node-3/server.properties"}
	if !slices.Equal(got, want) {
		t.Errorf("nodes %q, want %q", got, want)
	}
	if one, err := testbed.PlanNodes("/bed", testbed.NewPorts(52100, 52101, 52432), 1); err != nil || len(one) != 1 || one[0].DirID != "" {
		t.Errorf("one node: %+v, %v; want one node without a directory id (--standalone)", one, err)
	}
	for _, c := range []struct {
		p    testbed.Ports
		want string
	}{
		{testbed.NewPorts(52100, 52110, 52432), "Kafka node 1's controller and Kafka node 2 would both listen on port 52110"},
		{testbed.NewPorts(52100, 52101, 52120), "PostgreSQL and Kafka node 3 would both listen on port 52120"},
		{testbed.NewPorts(65520, 65521, 52432), "Kafka node 3 would listen on port 65540"},
	} {
		if _, err := testbed.PlanNodes("/bed", c.p, 3); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ports %v: err %v, want it to say %q", c.p, err, c.want)
		}
	}
}

// TestArgvCarriesMark: the ownership checks look for the mark in the
// command line the bed starts; the two must agree, or down would never
// stop what up started.
func TestArgvCarriesMark(t *testing.T) {
	k := &testbed.KafkaState{Version: "4.1.1", ClusterID: "id", Java: "/usr/bin/java", Jars: "/bed/jars/kafka-4.1.1",
		Log4j: "/repo/scripts/kafka/log4j2.xml", Heap: []string{"-Xms256m", "-Xmx512m"}}
	n := testbed.Broker{ID: 1, Config: "/bed/kafka/node-1/server.properties", Logs: "/bed/kafka/node-1/logs"}
	argv := testbed.BrokerArgv(k, n)
	if !n.Mark().In(argv) {
		t.Fatalf("broker argv %q lacks its mark %v", argv, n.Mark())
	}
	want := []string{"/usr/bin/java", "-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true", "-Dlog4j2.configurationFile=/repo/scripts/kafka/log4j2.xml", "-Dkafka.logs.dir=/bed/kafka/node-1/logs",
		"-cp", "/bed/jars/kafka-4.1.1/*", "kafka.Kafka", "/bed/kafka/node-1/server.properties"}
	if !slices.Equal(argv, want) {
		t.Fatalf("broker argv (a state without a JIT: tiered)\n%q\nwant\n%q", argv, want)
	}
	for jit, flag := range map[string]bool{testbed.JITTiered: false, testbed.JITClient: true} {
		k := *k
		k.JIT = jit
		argv := testbed.BrokerArgv(&k, n)
		if slices.Contains(argv, "-XX:TieredStopAtLevel=1") != flag || !n.Mark().In(argv) {
			t.Errorf("broker argv with JIT %s: %q; want -XX:TieredStopAtLevel=1 %v, and the mark", jit, argv, flag)
		}
	}
	f := testbed.FormatArgv(k, n)
	if n.Mark().In(f) {
		t.Fatalf("the format command %q carries the broker's mark: down would take it for the broker", f)
	}
	if !slices.Contains(f, "--standalone") || !slices.Contains(f, "-Dkafka.logs.dir=/bed/kafka/node-1/logs/format") ||
		!(slices.Index(f, "-t") >= 0 && f[slices.Index(f, "-t")+1] == "id") {
		t.Fatalf("format argv %q", f)
	}

	if i := slices.Index(f, "--feature"); i >= 0 {
		t.Fatalf("format argv of 4.1.1 %q sets a feature (%q): share groups are a preview there", f, f[i+1:])
	}
	// From 4.2 the format asks for share groups, from 4.4 with their
	// dead-letter queue (share.version 2).
	for v, want := range map[string]string{"4.2.0": "share.version=1", "4.3.1": "share.version=1", "4.4.0": "share.version=2", "5.1.0": "share.version=2"} {
		k := *k
		k.Version = v
		f := testbed.FormatArgv(&k, n)
		if i := slices.Index(f, "--feature"); i < 0 || i+1 == len(f) || f[i+1] != want {
			t.Errorf("format argv of %s %q: want --feature %s", v, f, want)
		}
	}

	p := &testbed.PostgresState{Bin: "/usr/lib/postgresql/15/bin", Data: "/bed/pg/data"}
	if pa := testbed.PostgresArgv(p); !p.Mark().In(pa) || pa[0] != "/usr/lib/postgresql/15/bin/postgres" {
		t.Fatalf("postgres argv %q lacks its mark %v", pa, p.Mark())
	}
	if ia := testbed.InitdbArgv(p.Bin, p.Data); !slices.Equal(ia, []string{"/usr/lib/postgresql/15/bin/initdb", "-D", "/bed/pg/data",
		"-U", "tidemark", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"}) {
		t.Fatalf("initdb argv %q", ia)
	}
}

func TestNewClusterID(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		id := testbed.NewClusterID()
		b, err := base64.RawURLEncoding.DecodeString(id)
		if err != nil || len(b) != 16 || id[0] == '-' || seen[id] {
			t.Fatalf("cluster id %q: %v, %d bytes, seen %v", id, err, len(b), seen[id])
		}
		seen[id] = true
	}
}

func TestJavaVersion(t *testing.T) {
	for _, c := range []struct {
		out   string
		v     string
		major int
	}{
		{`openjdk version "17.0.15" 2025-04-15`, "17.0.15", 17},
		{`openjdk version "21" 2023-09-19`, "21", 21},
		{`java version "1.8.0_392"`, "1.8.0_392", 8},
		{`openjdk version "25-ea" 2025-09-16`, "25-ea", 25},
		{`Error: could not find libjava.so`, "", 0},
	} {
		v, major := testbed.JavaVersion([]byte(c.out + "\nOpenJDK Runtime Environment"))
		if v != c.v || major != c.major {
			t.Errorf("%q: %q %d, want %q %d", c.out, v, major, c.v, c.major)
		}
	}
}

func TestPGConf(t *testing.T) {
	conf := testbed.PGConf(36432)
	for _, l := range []string{"listen_addresses = '127.0.0.1'", "port = 36432", "unix_socket_directories = ''",
		"max_connections = 200", "fsync = off", "synchronous_commit = off", "full_page_writes = off"} {
		if !strings.Contains(conf, "\n"+l+"\n") {
			t.Errorf("postgresql.conf lacks %q:\n%s", l, conf)
		}
	}
	var rules []string
	for _, l := range strings.Split(testbed.PGHBA, "\n") {
		if l != "" && l[0] != '#' {
			rules = append(rules, l)
		}
	}
	if !slices.Equal(rules, []string{"host all all 127.0.0.1/32 trust"}) {
		t.Fatalf("pg_hba.conf rules %q, want trust on 127.0.0.1 only", rules)
	}
}

func TestPGDataDir(t *testing.T) {
	if d := testbed.PGDataDir("/work/x/.testbed", func(string) bool { return true }); d != "/work/x/.testbed/pg/data" {
		t.Fatalf("reachable: %q", d)
	}
	var asked string
	a := testbed.PGDataDir("/root/x/.testbed", func(d string) bool { asked = d; return false })
	b := testbed.PGDataDir("/root/y/.testbed", func(string) bool { return false })
	if asked != "/root/x/.testbed/pg" {
		t.Fatalf("asked about %q, want the pg directory", asked)
	}
	if !strings.HasPrefix(a, os.TempDir()+"/tidemark-testbed-") || filepath.Base(a) != "data" || a == b {
		t.Fatalf("unreachable: %q and %q, want distinct directories under %s", a, b, os.TempDir())
	}
	if a2 := testbed.PGDataDir("/root/x/.testbed", func(string) bool { return false }); a2 != a {
		t.Fatalf("not stable: %q then %q", a, a2)
	}
}
