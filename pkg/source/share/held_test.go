package share_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

func newIdle(t *testing.T, sessions int) *share.Source {
	t.Helper()
	src, err := share.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, share.Sessions(sessions))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

func krec(p int32, off int64) *kgo.Record {
	return &kgo.Record{Topic: "t", Partition: p, Offset: off, Value: []byte("v")}
}

// TestRedeliveryWhileHeld: a record polled by one session while the runner
// still holds it from another (its first lock was lost) is not handed over
// again — the runner never holds one offset twice — and settling it
// settles both copies, so neither session waits for it any more.
func TestRedeliveryWhileHeld(t *testing.T) {
	t.Parallel()
	src := newIdle(t, 2)
	now := time.Now()
	b0 := src.TakeForTest(0, []*kgo.Record{krec(0, 5), krec(0, 6)}, now)
	if len(b0) != 1 || len(b0[0].Records) != 2 {
		t.Fatalf("first poll handed over %v, want one batch of 2", b0)
	}
	// Session 1 gets offset 6 again (and 7, new), below nothing: out of
	// order is fine.
	b1 := src.TakeForTest(1, []*kgo.Record{krec(0, 7), krec(0, 6)}, now)
	if len(b1) != 1 || len(b1[0].Records) != 1 || b1[0].Records[0].Offset != 7 {
		t.Fatalf("second poll handed over %v, want only offset 7", b1)
	}
	if s1, all := src.HeldForTest(1); s1 != 2 || all != 3 {
		t.Fatalf("held: session 1 %d, source %d; want 2 (7 and the copy of 6) and 3", s1, all)
	}
	src.Settle(runner.TP{Topic: "t", Partition: 0}, 6, runner.Accepted)
	if s0, _ := src.HeldForTest(0); s0 != 1 {
		t.Errorf("session 0 holds %d after 6 was settled, want 1 (5)", s0)
	}
	if s1, all := src.HeldForTest(1); s1 != 1 || all != 2 {
		t.Errorf("after 6 was settled: session 1 holds %d, source %d; want 1 (7) and 2", s1, all)
	}
}

// TestReleaseUntaken: when the runner took none of a poll (it stopped),
// the session drops what it handed over, and a copy of a record the runner
// holds from another session stays held until that one is settled.
func TestReleaseUntaken(t *testing.T) {
	t.Parallel()
	src := newIdle(t, 2)
	now := time.Now()
	src.TakeForTest(0, []*kgo.Record{krec(0, 1)}, now)
	polled := []*kgo.Record{krec(0, 1), krec(0, 2)}
	src.TakeForTest(1, polled, now)
	src.ReleaseForTest(1, polled)
	if s1, all := src.HeldForTest(1); s1 != 1 || all != 1 {
		t.Fatalf("after the release: session 1 holds %d, source %d; want 1 (the copy of 1) and 1", s1, all)
	}
	src.Settle(runner.TP{Topic: "t", Partition: 0}, 1, runner.Released)
	if s0, all := src.HeldForTest(0); s0 != 0 || all != 0 {
		t.Fatalf("after 1 was settled: session 0 holds %d, source %d; want 0 and 0", s0, all)
	}
	if s1, _ := src.HeldForTest(1); s1 != 0 {
		t.Fatalf("after 1 was settled: session 1 holds %d, want 0", s1)
	}
}

// TestSettleWhileAPollIsTaken: Settle, on the runner's goroutine, reads
// what a session learnt of the lock duration (to tell whether an ack must
// go alone) while the session's goroutine takes a new poll, which may
// learn a longer one. Run with -race: the session must write it under the
// source's lock.
func TestSettleWhileAPollIsTaken(t *testing.T) {
	// Not parallel: it swaps the package's lock-deadline reader.
	now := time.Now()
	undo := share.LockRecordsForTest(map[string]time.Time{
		"a": now.Add(10 * time.Second), "b": now.Add(20 * time.Second),
	})
	defer undo()
	src := newIdle(t, 2)
	rec := func(off int64, v string) *kgo.Record {
		return &kgo.Record{Topic: "t", Partition: 0, Offset: off, Value: []byte(v)}
	}
	src.TakeForTest(0, []*kgo.Record{rec(1, "a")}, now)
	// Session 1 gets offset 1 again: a copy, settled with the first.
	src.TakeForTest(1, []*kgo.Record{rec(1, "a")}, now)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// No synchronisation with the take below but the source's own:
		// the sleep only makes the take come first most times.
		time.Sleep(20 * time.Millisecond)
		src.Settle(runner.TP{Topic: "t", Partition: 0}, 1, runner.Accepted)
	}()
	// A longer lock than session 1 has seen: it learns a new duration.
	src.TakeForTest(1, []*kgo.Record{rec(2, "b")}, now)
	<-done
	if s1, all := src.HeldForTest(1); s1 != 1 || all != 1 {
		t.Fatalf("after 1 was settled: session 1 holds %d, source %d; want 1 (offset 2) and 1", s1, all)
	}
}
