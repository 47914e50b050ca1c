package testbed_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/testbed"
)

// fakeBed is a bed whose state records fake servers (sh processes with the
// marks of a broker and a postmaster), so Down, Stop and Status can be
// tested without starting Kafka or PostgreSQL.
type fakeBed struct {
	bed             *testbed.Bed
	dir             string
	out             *bytes.Buffer
	st              *testbed.State
	kafkaSig, pgSig string
}

func newFakeBed(t *testing.T) *fakeBed {
	t.Helper()
	root := t.TempDir()
	f := &fakeBed{dir: filepath.Join(root, ".testbed"), out: &bytes.Buffer{}}
	b, err := testbed.New(testbed.Config{Root: root, Out: f.out})
	if err != nil {
		t.Fatal(err)
	}
	f.bed = b
	nd := filepath.Join(f.dir, "kafka", "node-1")
	n := testbed.Broker{ID: 1, Roles: []string{"broker", "controller"}, Port: 1, ControllerPort: 2, Dir: nd,
		Config: filepath.Join(nd, "server.properties"), Data: filepath.Join(nd, "data"), Logs: filepath.Join(nd, "logs")}
	p := &testbed.PostgresState{Port: 3, Data: filepath.Join(f.dir, "pg", "data"), Log: filepath.Join(f.dir, "pg", "postgres.log")}
	f.kafkaSig, f.pgSig = filepath.Join(root, "kafka.sig"), filepath.Join(root, "pg.sig")
	n.PID = fakeServer(t, f.kafkaSig, false, n.Mark()[0], n.Mark()[1])
	p.PID = fakeServer(t, f.pgSig, false, p.Mark()[0], p.Mark()[1])
	f.st = &testbed.State{Kafka: &testbed.KafkaState{Version: "4.1.1", Nodes: []testbed.Broker{n}}, Postgres: p}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testbed.SaveState(f.dir, f.st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.bed.EnvFile(), testbed.EnvFileContent(f.st, f.bed.EnvFile()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeBed) kafkaPID() int { return f.st.Kafka.Nodes[0].PID }
func (f *fakeBed) pgPID() int    { return f.st.Postgres.PID }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestDown: down stops exactly the recorded processes — SIGTERM for the
// broker, SIGINT for PostgreSQL — and removes the state and env files; a
// second down says nothing runs.
func TestDown(t *testing.T) {
	f := newFakeBed(t)
	if err := f.bed.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !testbed.Exited(f.kafkaPID()) || !testbed.Exited(f.pgPID()) {
		t.Fatal("a recorded process runs after down")
	}
	if got := readSig(t, f.kafkaSig); got != "TERM" {
		t.Errorf("Kafka got %q, want TERM (a controlled shutdown)", got)
	}
	if got := readSig(t, f.pgSig); got != "INT" {
		t.Errorf("PostgreSQL got %q, want INT (fast shutdown)", got)
	}
	if exists(testbed.StatePath(f.dir)) || exists(f.bed.EnvFile()) {
		t.Error("state.json or env left after down")
	}
	for _, w := range []string{"stopping Kafka (pid " + strconv.Itoa(f.kafkaPID()) + ")", "stopping PostgreSQL (pid " + strconv.Itoa(f.pgPID()) + ")"} {
		if !strings.Contains(f.out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, f.out)
		}
	}
	f.out.Reset()
	if err := f.bed.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.out.String(); got != "testbed: Kafka not running\ntestbed: PostgreSQL not running\n" {
		t.Errorf("second down said %q", got)
	}
}

// TestDownLeavesOthersAlone: a recorded pid that now belongs to a process
// without our mark (the kernel reused it) is not signalled.
func TestDownLeavesOthersAlone(t *testing.T) {
	f := newFakeBed(t)
	otherSig := filepath.Join(t.TempDir(), "other.sig")
	other := fakeServer(t, otherSig, false, "kafka.Kafka", "/somebody/else/server.properties")
	f.st.Kafka.Nodes[0].PID = other
	f.st.Postgres.PID = other
	if err := testbed.SaveState(f.dir, f.st); err != nil {
		t.Fatal(err)
	}
	if err := f.bed.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if testbed.Exited(other) || readSig(t, otherSig) != "" {
		t.Fatal("down signalled a process that is not the bed's")
	}
	if !strings.Contains(f.out.String(), "Kafka not running (pid "+strconv.Itoa(other)+" is another process now; left alone)") {
		t.Errorf("output: %s", f.out)
	}
	if exists(testbed.StatePath(f.dir)) {
		t.Error("state.json left after down")
	}
}

// TestStopKeepsTheBed: stop of one service signals only it (SIGQUIT for
// PostgreSQL under --kill, SIGKILL for Kafka), records it as stopped and
// keeps the state and env for start.
func TestStopKeepsTheBed(t *testing.T) {
	f := newFakeBed(t)
	kafka := f.kafkaPID()
	if err := f.bed.Stop(context.Background(), testbed.Service{Kind: testbed.Postgres}, testbed.Crash); err != nil {
		t.Fatal(err)
	}
	if got := readSig(t, f.pgSig); got != "QUIT" {
		t.Errorf("PostgreSQL got %q, want QUIT (immediate shutdown)", got)
	}
	if testbed.Exited(kafka) {
		t.Fatal("stop postgres stopped Kafka")
	}
	if err := f.bed.Stop(context.Background(), testbed.Service{Kind: testbed.Kafka, Node: 1}, testbed.Crash); err != nil {
		t.Fatal(err)
	}
	if !testbed.Exited(kafka) || readSig(t, f.kafkaSig) != "" {
		t.Error("Kafka under --kill: want SIGKILL (no trap runs)")
	}
	st, err := testbed.LoadState(f.dir)
	if err != nil || st == nil {
		t.Fatalf("state after stop: %v, %v", st, err)
	}
	if st.Kafka.Nodes[0].PID != 0 || st.Postgres.PID != 0 {
		t.Errorf("stopped services still recorded with pids %d, %d", st.Kafka.Nodes[0].PID, st.Postgres.PID)
	}
	if !exists(f.bed.EnvFile()) {
		t.Error("stop removed the env file")
	}
	f.out.Reset()
	if err := f.bed.Stop(context.Background(), testbed.Service{Kind: testbed.Kafka}, testbed.Graceful); err != nil {
		t.Fatal(err)
	}
	if f.out.String() != "testbed: Kafka not running\n" {
		t.Errorf("stop of a stopped Kafka said %q", f.out)
	}
	if err := f.bed.Stop(context.Background(), testbed.Service{Kind: testbed.Kafka, Node: 2}, testbed.Graceful); err == nil ||
		!strings.Contains(err.Error(), "no Kafka node 2") {
		t.Errorf("stop kafka-2 of a one-node bed: %v", err)
	}
}

// TestStartUsesRecordedPorts: start and restart act on the server as up
// recorded it. The bash bed read TIDEMARK_KAFKA_PORT again, so a restart
// with another value in the environment waited 120 s on a port the broker
// was not on. Here the setting says 36999 and the check goes to the
// recorded port (where the fake broker does not answer).
func TestStartUsesRecordedPorts(t *testing.T) {
	f := newFakeBed(t)
	b, err := testbed.New(testbed.Config{Root: filepath.Dir(f.dir), KafkaPort: 36999, PGPort: 36998, Out: f.out})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start(context.Background(), testbed.Service{Kind: testbed.Kafka})
	if err == nil || !strings.Contains(err.Error(), "does not answer on 127.0.0.1:1") || strings.Contains(err.Error(), "36999") {
		t.Fatalf("start kafka with another port set: %v", err)
	}
	err = b.Start(context.Background(), testbed.Service{Kind: testbed.Postgres})
	if err == nil || !strings.Contains(err.Error(), "does not answer on 127.0.0.1:3") || strings.Contains(err.Error(), "36998") {
		t.Fatalf("start postgres with another port set: %v", err)
	}
}

func TestOneNeedsABed(t *testing.T) {
	b, err := testbed.New(testbed.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for name, fn := range map[string]func() error{
		"stop": func() error {
			return b.Stop(context.Background(), testbed.Service{Kind: testbed.Kafka}, testbed.Graceful)
		},
		"start": func() error { return b.Start(context.Background(), testbed.Service{Kind: testbed.Postgres}) },
		"restart": func() error {
			return b.Restart(context.Background(), testbed.Service{Kind: testbed.Kafka}, testbed.Crash)
		},
	} {
		if err := fn(); err == nil || !strings.Contains(err.Error(), "no test bed was set up") || !strings.Contains(err.Error(), "scripts/testbed up") {
			t.Errorf("%s without a bed: %v", name, err)
		}
	}
}

// TestStatusOfFakes: status reports the recorded processes that are ours
// as running (not answering here: nothing listens on their ports) and one
// that is not ours as not running.
func TestStatusOfFakes(t *testing.T) {
	f := newFakeBed(t)
	s, err := f.bed.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Servers) != 2 || s.Servers[0].PID != f.kafkaPID() || s.Servers[1].PID != f.pgPID() ||
		s.Servers[0].Err == nil || s.Servers[1].Err == nil || s.Code() != 1 || s.Env != f.bed.EnvFile() {
		t.Fatalf("status %+v", s)
	}
	lines := strings.Join(s.Lines(), "\n")
	if !strings.Contains(lines, "Kafka 4.1.1: running (pid "+strconv.Itoa(f.kafkaPID())+") but NOT answering on 127.0.0.1:1") ||
		!strings.Contains(lines, "export TIDEMARK_KAFKA_BROKERS='127.0.0.1:1'") {
		t.Fatalf("status lines:\n%s", lines)
	}
	if err := f.bed.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err = f.bed.Status(context.Background())
	if err != nil || s.Code() != 3 || s.State != nil {
		t.Fatalf("status after down: %+v, %v", s, err)
	}
}

func TestStatusCode(t *testing.T) {
	up := testbed.ServerStatus{PID: 10}
	down := testbed.ServerStatus{}
	deaf := testbed.ServerStatus{PID: 11, Err: errors.New("no")}
	for _, c := range []struct {
		s    []testbed.ServerStatus
		want int
	}{
		{[]testbed.ServerStatus{up, up}, 0},
		{[]testbed.ServerStatus{up, down}, 3},
		{[]testbed.ServerStatus{down, down}, 3},
		{[]testbed.ServerStatus{down, deaf}, 1},
		{[]testbed.ServerStatus{deaf, down}, 1},
	} {
		if got := (testbed.Status{Servers: c.s}).Code(); got != c.want {
			t.Errorf("%+v: Code = %d, want %d", c.s, got, c.want)
		}
	}
}

func TestParseService(t *testing.T) {
	for _, c := range []struct {
		in   string
		want testbed.Service
		err  bool
	}{
		{"kafka", testbed.Service{Kind: testbed.Kafka}, false},
		{"kafka-2", testbed.Service{Kind: testbed.Kafka, Node: 2}, false},
		{"postgres", testbed.Service{Kind: testbed.Postgres}, false},
		{"kafka-0", testbed.Service{}, true},
		{"kafka-x", testbed.Service{}, true},
		{"pg", testbed.Service{}, true},
		{"", testbed.Service{}, true},
	} {
		got, err := testbed.ParseService(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseService(%q) = %v, %v", c.in, got, err)
		}
		if err == nil && got.String() != c.in {
			t.Errorf("%q round-trips to %q", c.in, got.String())
		}
	}
}

// What up checks before it starts anything, and what it writes.

func TestKafkaJars(t *testing.T) {
	dir := t.TempDir()
	err := testbed.KafkaJars(dir, "4.4.0")
	if err == nil || !strings.Contains(err.Error(), "scripts/testbed provision") || !strings.Contains(err.Error(), "4.4.0") {
		t.Fatalf("no jars: err = %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kafka_2.13-4.4.0.jar"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testbed.KafkaJars(dir, "4.4.0"); err != nil {
		t.Fatal(err)
	}
	if err := testbed.KafkaJars(dir, "4.1.1"); err == nil {
		t.Fatal("the jars of 4.4.0 passed for 4.1.1")
	}
}

func TestFindPGBin(t *testing.T) {
	dir := t.TempDir()
	if _, err := testbed.FindPGBin(dir); err == nil || !strings.Contains(err.Error(), "TIDEMARK_PG_BIN="+dir) {
		t.Fatalf("an empty directory: err = %v", err)
	}
	for _, p := range []string{"initdb", "postgres"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := testbed.FindPGBin(dir); err != nil || got != dir {
		t.Fatalf("FindPGBin = %q, %v", got, err)
	}
}

func TestEnvFile(t *testing.T) {
	st := cluster("/bed")
	got := string(testbed.EnvFileContent(st, "/bed/env"))
	want := "# Written by scripts/testbed up; removed by down. Use: source /bed/env\n" +
		"export TIDEMARK_KAFKA_BROKERS='127.0.0.1:36092,127.0.0.1:36094,127.0.0.1:36096'\n" +
		"export TIDEMARK_PG_DSN='postgres://tidemark@127.0.0.1:36432/tidemark?sslmode=disable'\n"
	if got != want {
		t.Fatalf("env file\n%s\nwant\n%s", got, want)
	}
}

// TestLegacyBed: a bed the bash scripts/testbed started (pid files, no
// state.json) makes up refuse, and down stops it with the same signals
// and ownership checks.
func TestLegacyBed(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, ".testbed")
	for _, d := range []string{"kafka", "pg"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "pg", "data")
	kSig, pSig := filepath.Join(root, "k.sig"), filepath.Join(root, "p.sig")
	k := fakeServer(t, kSig, false, "kafka.Kafka", filepath.Join(dir, "kafka", "server.properties"))
	p := fakeServer(t, pSig, false, "-D", data)
	for f, v := range map[string]string{"kafka/kafka.pid": strconv.Itoa(k), "pg/postgres.pid": strconv.Itoa(p), "pg/datadir": data,
		"ports": "RECORDED_KAFKA_PORT=1\n", "env": "export X=1\n"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	b, err := testbed.New(testbed.Config{Root: root, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Up(context.Background()); err == nil || !strings.Contains(err.Error(), "bash scripts/testbed") {
		t.Fatalf("up beside an old bed: %v", err)
	}
	s, err := b.Status(context.Background())
	if err != nil || s.Code() != 1 || len(s.Servers) != 2 {
		t.Fatalf("status of an old bed: %+v, %v", s, err)
	}
	if l := s.Lines()[0]; l != "Kafka: running (pid "+strconv.Itoa(k)+") but NOT answering on 127.0.0.1:1 (started by the bash scripts/testbed of before; scripts/testbed down stops it); log: "+filepath.Join(dir, "kafka", "logs", "server.log") {
		t.Errorf("status line %q", l)
	}
	if err := b.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !testbed.Exited(k) || !testbed.Exited(p) || readSig(t, kSig) != "TERM" || readSig(t, pSig) != "INT" {
		t.Fatalf("old bed after down: kafka sig %q, pg sig %q", readSig(t, kSig), readSig(t, pSig))
	}
	for _, f := range []string{"kafka/kafka.pid", "pg/postgres.pid", "ports", "env"} {
		if exists(filepath.Join(dir, f)) {
			t.Errorf("%s left after down", f)
		}
	}
}
