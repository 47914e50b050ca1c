package testbed_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/tidemark/tidemark/internal/testbed"
)

// cluster is a state of three nodes: the layout must hold a cluster, not
// only today's single node.
func cluster(dir string) *testbed.State {
	st := &testbed.State{
		Kafka: &testbed.KafkaState{Version: "4.4.0", ClusterID: "abc", Java: "/usr/bin/java", Jars: "/j", Log4j: "/l.xml",
			Heap: []string{"-Xmx512m"}},
		Postgres: &testbed.PostgresState{Version: "15.14", Bin: "/pg/bin", Port: 36432, Data: "/d", Log: "/d.log", RunAs: "postgres", PID: 42},
	}
	for i := int32(1); i <= 3; i++ {
		nd := filepath.Join(dir, "kafka", "node-"+string('0'+rune(i)))
		st.Kafka.Nodes = append(st.Kafka.Nodes, testbed.Broker{ID: i, Roles: []string{"broker", "controller"},
			Port: 36090 + 2*int(i), ControllerPort: 36091 + 2*int(i), Dir: nd, Config: nd + "/server.properties",
			Data: nd + "/data", Logs: nd + "/logs", PID: 1000 + int(i)})
	}
	return st
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if st, err := testbed.LoadState(dir); st != nil || err != nil {
		t.Fatalf("no state file: LoadState = %v, %v; want nil, nil", st, err)
	}
	want := cluster(dir)
	if err := testbed.SaveState(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := testbed.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded %+v\nsaved  %+v", got, want)
	}
	if got.Format != 1 || got.Dir != dir {
		t.Fatalf("format %d dir %q", got.Format, got.Dir)
	}
	if b := got.Brokers(); b != "127.0.0.1:36092,127.0.0.1:36094,127.0.0.1:36096" {
		t.Fatalf("Brokers = %q", b)
	}
	if d := got.DSN(); d != "postgres://tidemark@127.0.0.1:36432/tidemark?sslmode=disable" {
		t.Fatalf("DSN = %q", d)
	}
	// Written by rename: nothing else is left in the directory.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "state.json" {
		t.Fatalf("directory holds %v, want only state.json", ents)
	}
}

func TestStateRefused(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ content, want string }{
		{"{not json", "is not a test bed state file"},
		{`{"format": 2}`, "has format 2, this testbed reads format 1"},
		{`{}`, "has format 0"},
	} {
		if err := os.WriteFile(testbed.StatePath(dir), []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := testbed.LoadState(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), testbed.StatePath(dir)) {
			t.Errorf("%q: err = %v, want it to name the file and say %q", c.content, err, c.want)
		}
	}
}

// TestLock: while one holder has the lock, nobody else gets it; after
// unlock they do.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	unlock, err := testbed.Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	other := func() error {
		f, err := os.Open(testbed.LockPath(dir))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err := other(); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("a second flock while held: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := other(); err != nil {
		t.Fatalf("a second flock after unlock: %v", err)
	}
}
