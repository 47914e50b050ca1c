package testbed_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/testbed"
)

// procState is the state letter of pid in /proc (T: stopped).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return s[strings.LastIndexByte(s, ')')+2]
}

// TestPauseResume: pause stops the node's JVM with SIGSTOP and records it,
// status says so, resume continues it; and a graceful stop of a paused
// node continues it first, so its SIGTERM acts at once instead of after
// the 30 s stop timeout's SIGKILL.
func TestPauseResume(t *testing.T) {
	f := newFakeBed(t)
	ctx := context.Background()
	kafka := testbed.Service{Kind: testbed.Kafka, Node: 1}
	if err := f.bed.Pause(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if s := procState(t, f.kafkaPID()); s != 'T' {
		t.Fatalf("after pause the broker's state is %q, want T (stopped)", s)
	}
	st, err := testbed.LoadState(f.dir)
	if err != nil || !st.Kafka.Nodes[0].Paused {
		t.Fatalf("state after pause: %+v, %v; want the node recorded as paused", st.Kafka.Nodes[0], err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := f.bed.Status(sctx)
	cancel()
	if err != nil || !strings.Contains(strings.Join(s.Lines(), "\n"), "PAUSED (SIGSTOP): scripts/testbed resume kafka-1") {
		t.Errorf("status of a paused node: %q, %v", s.Lines(), err)
	}
	if err := f.bed.Resume(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if s := procState(t, f.kafkaPID()); s == 'T' {
		t.Fatal("after resume the broker is still stopped")
	}
	if st, _ := testbed.LoadState(f.dir); st.Kafka.Nodes[0].Paused {
		t.Error("resume left the node recorded as paused")
	}

	if err := f.bed.Pause(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := f.bed.Stop(ctx, kafka, testbed.Graceful); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 10*time.Second || readSig(t, f.kafkaSig) != "TERM" {
		t.Errorf("graceful stop of a paused node took %s, signal %q; want TERM acted on at once", took, readSig(t, f.kafkaSig))
	}
	if err := f.bed.Pause(ctx, kafka); err == nil || !strings.Contains(err.Error(), "does not run") {
		t.Errorf("pause of a stopped node: %v, want an error saying it does not run", err)
	}
	if err := f.bed.Pause(ctx, testbed.Service{Kind: testbed.Postgres}); err == nil || !strings.Contains(err.Error(), "only Kafka") {
		t.Errorf("pause postgres: %v, want an error", err)
	}
}

// quorumNode is a fake Kafka node of a KRaft cluster whose nodes are all
// controllers: a SIGTERM's controlled shutdown ends (exit 0) only once
// every one of the $NODES nodes has got its SIGTERM, as a real node's needs
// the quorum of controllers, the others, alive. Each node, on SIGTERM,
// creates $TERMDIR/$NODE and waits for $NODES files there.
const quorumNode = `trap 'touch "$TERMDIR/$NODE"; while :; do set -- "$TERMDIR"/*; [ $# -ge "$NODES" ] && exit 0; sleep 0.05; done' TERM
echo ready; while :; do sleep 0.05; done`

// newFakeCluster is a bed of nodes quorumNode nodes, with the stop timeout
// stopTimeout and PostgreSQL recorded as not running. It returns the bed
// and the directory where the nodes note their SIGTERM.
func newFakeCluster(t *testing.T, nodes int, stopTimeout time.Duration) (*fakeBed, string) {
	t.Helper()
	root := t.TempDir()
	f := &fakeBed{dir: filepath.Join(root, ".testbed"), out: &bytes.Buffer{}}
	b, err := testbed.New(testbed.Config{Root: root, Out: f.out, StopTimeout: stopTimeout, KafkaNodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	f.bed = b
	termDir := filepath.Join(root, "term")
	if err := os.MkdirAll(termDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ns, err := testbed.PlanNodes(f.dir, testbed.NewPorts(36000, 36001, 36002), nodes)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ns {
		m := ns[i].Mark()
		ns[i].PID = startSh(t, quorumNode, []string{"TERMDIR=" + termDir, "NODE=" + strconv.Itoa(int(ns[i].ID)), "NODES=" + strconv.Itoa(nodes)}, m[0], m[1])
	}
	p := &testbed.PostgresState{Port: 36002, Data: filepath.Join(f.dir, "pg", "data"), Log: filepath.Join(f.dir, "pg", "postgres.log")}
	f.st = &testbed.State{Kafka: &testbed.KafkaState{Version: "4.1.1", Nodes: ns}, Postgres: p}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testbed.SaveState(f.dir, f.st); err != nil {
		t.Fatal(err)
	}
	return f, termDir
}

// TestStopClusterTogether: a graceful down, or stop of every node, of a
// cluster sends SIGTERM to all its nodes at once and waits for them
// together. Stopped one after the other, the last node had lost its
// controller quorum, so its controlled shutdown could not finish and it got
// SIGKILL after the stop timeout (30 s on every down of a cluster bed; the
// chaos suite's graceful restart of Kafka was a kill -9 of the last node).
// The fake nodes here end their shutdown only once all have got SIGTERM.
func TestStopClusterTogether(t *testing.T) {
	for _, c := range []struct {
		name string
		stop func(context.Context, *fakeBed) error
	}{
		{"down", func(ctx context.Context, f *fakeBed) error { return f.bed.Down(ctx) }},
		{"stop kafka", func(ctx context.Context, f *fakeBed) error {
			// A paused node is continued first, else it cannot act on
			// its SIGTERM.
			if err := f.bed.Pause(ctx, testbed.Service{Kind: testbed.Kafka, Node: 2}); err != nil {
				return err
			}
			return f.bed.Stop(ctx, testbed.Service{Kind: testbed.Kafka}, testbed.Graceful)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const nodes = 3
			f, termDir := newFakeCluster(t, nodes, 3*time.Second)
			pids := make([]int, nodes)
			for i, n := range f.st.Kafka.Nodes {
				pids[i] = n.PID
			}
			if err := c.stop(context.Background(), f); err != nil {
				t.Fatal(err)
			}
			out := f.out.String()
			if strings.Contains(out, "sent SIGKILL") {
				t.Errorf("a node got SIGKILL, so it was not stopped together with the others:\n%s", out)
			}
			for i, pid := range pids {
				id := i + 1
				if !testbed.Exited(pid) {
					t.Errorf("node %d (pid %d) runs after the stop", id, pid)
				}
				if !exists(filepath.Join(termDir, strconv.Itoa(id))) {
					t.Errorf("node %d got no SIGTERM", id)
				}
				if w := "stopping Kafka node " + strconv.Itoa(id) + " (pid " + strconv.Itoa(pid) + ")"; !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			st, err := testbed.LoadState(f.dir)
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "down" {
				if st != nil {
					t.Error("state.json left after down")
				}
				return
			}
			for _, n := range st.Kafka.Nodes {
				if n.PID != 0 || n.Paused {
					t.Errorf("node %d recorded after the stop as pid %d, paused %v; want 0, false", n.ID, n.PID, n.Paused)
				}
			}
		})
	}
}
