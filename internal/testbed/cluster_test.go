package testbed_test

import (
	"context"
	"os"
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
