package testbed_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/testbed"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	c, err := testbed.FromEnv("/repo", env(map[string]string{
		"TIDEMARK_KAFKA_PORT":            "36092",
		"TIDEMARK_KAFKA_CONTROLLER_PORT": "36093",
		"TIDEMARK_PG_PORT":               "36432",
		"TIDEMARK_KAFKA_VERSION":         "4.4.0",
		"TIDEMARK_KAFKA_HEAP":            " -Xms1g   -Xmx2g ",
		"TIDEMARK_KAFKA_START_TIMEOUT":   "7",
		"TIDEMARK_PG_START_TIMEOUT":      "9",
		"TIDEMARK_TESTBED_DIR":           "bed2",
		"TIDEMARK_PG_BIN":                "/opt/pg/bin",
		"JAVA_HOME":                      "/opt/jdk",
		"TIDEMARK_KAFKA_NODES":           "3",
		"TIDEMARK_KAFKA_JIT":             "tiered",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := testbed.Config{Root: "/repo", Dir: "bed2", KafkaPort: 36092, KafkaControllerPort: 36093, PGPort: 36432,
		KafkaVersion: "4.4.0", KafkaHeap: []string{"-Xms1g", "-Xmx2g"}, JavaHome: "/opt/jdk", PGBin: "/opt/pg/bin",
		KafkaStartTimeout: 7 * time.Second, PGStartTimeout: 9 * time.Second}
	if c.Root != want.Root || c.Dir != want.Dir || c.KafkaPort != want.KafkaPort || c.KafkaControllerPort != want.KafkaControllerPort ||
		c.PGPort != want.PGPort || c.KafkaVersion != want.KafkaVersion || !slices.Equal(c.KafkaHeap, want.KafkaHeap) ||
		c.JavaHome != want.JavaHome || c.PGBin != want.PGBin || c.KafkaStartTimeout != want.KafkaStartTimeout ||
		c.PGStartTimeout != want.PGStartTimeout || c.KafkaNodes != 3 || c.KafkaJIT != testbed.JITTiered {
		t.Fatalf("FromEnv = %+v\nwant %+v, 3 Kafka nodes and the tiered JIT", c, want)
	}

	// Nothing set: every field zero, so the defaults and the recorded
	// ports apply later.
	c, err = testbed.FromEnv("/repo", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.KafkaPort != 0 || c.PGPort != 0 || len(c.KafkaHeap) != 0 || c.KafkaVersion != "" || c.KafkaStartTimeout != 0 || c.KafkaNodes != 0 || c.KafkaJIT != "" {
		t.Fatalf("FromEnv with nothing set = %+v, want zero settings", c)
	}
	d, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d.Dir != "/repo/.testbed" || strings.Join(d.KafkaHeap, " ") != testbed.DefaultKafkaHeap ||
		d.KafkaStartTimeout != 120*time.Second || d.PGStartTimeout != 60*time.Second || d.StopTimeout != 30*time.Second {
		t.Fatalf("defaults = %+v", d)
	}
	// A cluster's nodes get the smaller heap unless one is set.
	c.KafkaNodes = 3
	if d, err = c.WithDefaults(); err != nil || strings.Join(d.KafkaHeap, " ") != testbed.DefaultClusterHeap {
		t.Fatalf("cluster defaults: heap %q, %v; want %q", d.KafkaHeap, err, testbed.DefaultClusterHeap)
	}
}

// TestFromEnvRejects: a value that does not parse is an error that names
// its variable and the value, and all of them are reported at once.
func TestFromEnvRejects(t *testing.T) {
	cases := []struct{ name, val, want string }{
		{"TIDEMARK_KAFKA_PORT", "x", `TIDEMARK_KAFKA_PORT="x" is not a port number`},
		{"TIDEMARK_KAFKA_CONTROLLER_PORT", "0", `TIDEMARK_KAFKA_CONTROLLER_PORT="0" is not a port number`},
		{"TIDEMARK_PG_PORT", "65536", `TIDEMARK_PG_PORT="65536" is not a port number`},
		{"TIDEMARK_KAFKA_START_TIMEOUT", "2m", `TIDEMARK_KAFKA_START_TIMEOUT="2m" is not a number of seconds`},
		{"TIDEMARK_PG_START_TIMEOUT", "0", `TIDEMARK_PG_START_TIMEOUT="0" is not a number of seconds`},
		{"TIDEMARK_KAFKA_VERSION", "../4.1.1", `TIDEMARK_KAFKA_VERSION="../4.1.1" is not a Kafka release`},
		{"TIDEMARK_KAFKA_NODES", "0", `TIDEMARK_KAFKA_NODES="0" is not a number of Kafka nodes (1-9)`},
		{"TIDEMARK_KAFKA_JIT", "c2", `TIDEMARK_KAFKA_JIT="c2" is not c1 (the client compiler only) or tiered`},
	}
	all := map[string]string{}
	for _, c := range cases {
		all[c.name] = c.val
		_, err := testbed.FromEnv("/repo", env(map[string]string{c.name: c.val}))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%q: err = %v, want it to say %q", c.name, c.val, err, c.want)
		}
	}
	_, err := testbed.FromEnv("/repo", env(all))
	for _, c := range cases {
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("all bad at once: err = %v, want it to say %q", err, c.want)
		}
	}
}

func TestDirRelativeToRoot(t *testing.T) {
	for _, c := range []struct{ dir, want string }{
		{"", "/repo/.testbed"},
		{"bed2", "/repo/bed2"},
		{"/var/tmp/bed/", "/var/tmp/bed"},
	} {
		d, err := testbed.Config{Root: "/repo", Dir: c.dir}.WithDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if d.Dir != c.want {
			t.Errorf("Dir %q: resolved to %q, want %q", c.dir, d.Dir, c.want)
		}
	}
	if _, err := (testbed.Config{}).WithDefaults(); err == nil {
		t.Error("a Config without Root was accepted")
	}
}

// TestPomVersion: the default Kafka release is the POM's, the file
// scripts/testbed provision reads too.
func TestPomVersion(t *testing.T) {
	dir := t.TempDir()
	pom := filepath.Join(dir, "pom.xml")
	if err := os.WriteFile(pom, []byte("<properties>\n  <kafka.version> 4.4.0 </kafka.version>\n</properties>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := testbed.PomVersion(pom); err != nil || v != "4.4.0" {
		t.Fatalf("PomVersion = %q, %v; want 4.4.0", v, err)
	}
	if err := os.WriteFile(pom, []byte("<properties/>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := testbed.PomVersion(pom); err == nil || !strings.Contains(err.Error(), "no <kafka.version>") {
		t.Fatalf("a POM without kafka.version: err = %v", err)
	}
	// The checkout's own POM parses.
	if v, err := testbed.PomVersion("../../scripts/kafka/pom.xml"); err != nil || !strings.HasPrefix(v, "4.") {
		t.Fatalf("scripts/kafka/pom.xml: %q, %v", v, err)
	}
}

func TestResolvePorts(t *testing.T) {
	recorded := &testbed.State{
		Kafka:    &testbed.KafkaState{Nodes: []testbed.Broker{{Port: 100, ControllerPort: 101}}},
		Postgres: &testbed.PostgresState{Port: 102},
	}
	cases := []struct {
		name              string
		set               [3]int
		st                *testbed.State
		kafkaRuns, pgRuns bool
		want              [3]int
		err               string
	}{
		{name: "defaults", want: [3]int{19092, 19093, 15432}},
		{name: "settings", set: [3]int{1, 2, 3}, want: [3]int{1, 2, 3}},
		{name: "recorded when not set", st: recorded, want: [3]int{100, 101, 102}},
		{name: "settings over recorded when nothing runs", set: [3]int{1, 2, 3}, st: recorded, want: [3]int{1, 2, 3}},
		{name: "running keeps its ports", st: recorded, set: [3]int{0, 0, 3}, kafkaRuns: true, want: [3]int{100, 101, 3}},
		{name: "running and the same setting", st: recorded, set: [3]int{100, 101, 102}, kafkaRuns: true, pgRuns: true, want: [3]int{100, 101, 102}},
		{name: "running and another setting", st: recorded, set: [3]int{5, 0, 0}, kafkaRuns: true,
			err: "TIDEMARK_KAFKA_PORT=5, but the bed's server runs on 100"},
		{name: "equal ports", set: [3]int{7, 7, 8}, err: "the three ports must differ"},
		{name: "equal to a running one", st: recorded, set: [3]int{0, 0, 100}, kafkaRuns: true, err: "the three ports must differ"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testbed.Config{KafkaPort: c.set[0], KafkaControllerPort: c.set[1], PGPort: c.set[2]}
			p, err := cfg.ResolvePorts(c.st, c.kafkaRuns, c.pgRuns)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k, ctl, pg := p.Values()
			if got := [3]int{k, ctl, pg}; got != c.want {
				t.Fatalf("ports = %v, want %v", got, c.want)
			}
		})
	}
}

func TestFindRoot(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "integration", "chaos")
	for _, d := range []string{deep, filepath.Join(root, "scripts")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := testbed.FindRoot(deep); err == nil {
		t.Fatal("FindRoot found a root without scripts/testbed")
	}
	if err := os.WriteFile(filepath.Join(root, "scripts", "testbed"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := testbed.FindRoot(deep)
	if err != nil || got != root {
		t.Fatalf("FindRoot = %q, %v; want %q", got, err, root)
	}
}
