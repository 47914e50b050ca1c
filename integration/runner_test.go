//go:build integration

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
)

// waitCommitted waits until the group's committed offset of every partition
// in want equals it; it fails when the commits stood still for within (see
// stall). It polls through one admin client (bed.Committed opens one per
// call).
func waitCommitted(t *testing.T, group, topic string, want map[int32]int64, within time.Duration) {
	t.Helper()
	adm := bed.Admin(t)
	st := newStall(within)
	got := map[int32]int64{}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := adm.FetchOffsetsForTopics(ctx, group, topic)
		cancel()
		if err == nil && resp.Error() == nil {
			for p, o := range resp[topic] {
				got[p] = o.At
			}
			ok := true
			for p, w := range want {
				ok = ok && got[p] == w
			}
			if ok {
				return
			}
		}
		if st.over(fmt.Sprint(got)) {
			t.Fatalf("committed %v (last error %v), want %v: %s", got, err, want, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stall bounds a wait for progress rather than for a time: the wait is
// over when what it watches has not changed for within, or after
// stallCap times within in all. A loaded machine (make test runs its
// phases side by side, on two cores) makes a test slower, and a wait for
// throughput with a fixed time would fail it; a wait that stands still
// is what a test must catch. The throughput itself is the benchmarks'
// (cmd/tidemark-bench), not a test's.
type stall struct {
	within, total time.Duration
	start, moved  time.Time
	last          any
}

// stallCap bounds a wait that keeps moving: within times stallCap.
const stallCap = 5

func newStall(within time.Duration) *stall {
	now := time.Now()
	return &stall{within: within, total: stallCap * within, start: now, moved: now}
}

// over records v, the watched value now, and reports whether the wait is
// over.
func (s *stall) over(v any) bool {
	now := time.Now()
	if v != s.last {
		s.last, s.moved = v, now
	}
	return now.Sub(s.moved) > s.within || now.Sub(s.start) > s.total
}

func (s *stall) String() string {
	now := time.Now()
	if now.Sub(s.start) > s.total {
		return fmt.Sprintf("still moving after %v, the most a wait gets (%d times %v)", s.total, stallCap, s.within)
	}
	return fmt.Sprintf("no change for %v (%v in all)", s.within, now.Sub(s.start).Round(time.Millisecond))
}

// TestPoisonBlocksOnlyItsKey: with the default Block policy a record that
// keeps failing is retried, the commit of its partition stays exactly at
// its offset, the other keys of that partition go on, and once the record
// succeeds the commit reaches the end (invariant 9).
func TestPoisonBlocksOnlyItsKey(t *testing.T) {
	t.Parallel()
	const records, keys = 3000, 50
	topic := bed.Topic(t, 3)
	group := bed.Group(t)
	bed.Produce(t, topic, records, func(i int) string { return "key-" + strconv.Itoa(i%keys) })
	const poison = 1500 // value of the poison record; its key is key-0
	var healed atomic.Bool
	var poisonAt atomic.Value // runner.Record
	var attempts atomic.Int32
	var mu sync.Mutex
	perKey := map[string]int{}
	m := startMember(t, "m", group, topic, func(ctx context.Context, rec runner.Record) error {
		if string(rec.Value) == strconv.Itoa(poison) && !healed.Load() {
			poisonAt.Store(rec)
			attempts.Add(1)
			return errors.New("poison")
		}
		mu.Lock()
		perKey[string(rec.Key)]++
		mu.Unlock()
		return nil
	}, runner.Backoff(10*time.Millisecond, 50*time.Millisecond))
	defer m.Stop(t)

	end := bed.EndOffsets(t, topic)
	deadline := time.Now().Add(time.Minute)
	for attempts.Load() < 5 || perKeyDone(&mu, perKey, keys, records) < keys-1 {
		if time.Now().After(deadline) {
			t.Fatalf("poison attempts %d, keys done %d of %d", attempts.Load(), perKeyDone(&mu, perKey, keys, records), keys-1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec := poisonAt.Load().(runner.Record)
	want := map[int32]int64{}
	for p, e := range end {
		want[p] = e
	}
	want[rec.Partition] = rec.Offset
	waitCommitted(t, group, topic, want, 30*time.Second)
	time.Sleep(time.Second) // several commit intervals: it must stay there
	if got := bed.Committed(t, group, topic)[rec.Partition]; got != rec.Offset {
		t.Fatalf("partition %d committed %d past the failing record at %d", rec.Partition, got, rec.Offset)
	}
	healed.Store(true)
	waitCommitted(t, group, topic, end, 30*time.Second)
}

// perKeyDone counts the keys whose records were all handled.
func perKeyDone(mu *sync.Mutex, perKey map[string]int, keys, records int) int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, c := range perKey {
		if c == records/keys {
			n++
		}
	}
	return n
}

// TestPanicGoesToDeadLetter: a handler that panics on one record does not
// crash the process; after three attempts the record is written to the
// dead-letter topic with its headers, the error and its origin, and the
// commit passes it only then.
func TestPanicGoesToDeadLetter(t *testing.T) {
	t.Parallel()
	topic := bed.Topic(t, 1)
	dlq := bed.Topic(t, 1)
	group := bed.Group(t)
	cl := bed.Client(t)
	var origin []*kgo.Record
	for i := range 10 {
		r := &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: "origin", Value: []byte("test")}}}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		origin = append(origin, r) // ProduceSync set its timestamp
	}
	m := startMember(t, "m", group, topic, func(ctx context.Context, rec runner.Record) error {
		if string(rec.Value) == "4" {
			panic("cannot handle 4")
		}
		return nil
	}, runner.Failure(runner.DeadLetter(dlq, 3, nil)), runner.Backoff(5*time.Millisecond, 10*time.Millisecond))
	defer m.Stop(t)
	waitCommitted(t, group, topic, map[int32]int64{0: 10}, 30*time.Second)

	rd := bed.Client(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs := rd.PollFetches(ctx)
	if err := fs.Err(); err != nil {
		t.Fatalf("reading the dead-letter topic: %v", err)
	}
	recs := fs.Records()
	if len(recs) != 1 {
		t.Fatalf("%d dead-letter records, want 1", len(recs))
	}
	got := map[string]string{}
	for _, h := range recs[0].Headers {
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{"origin": "test", runner.HeaderAttempts: "3", runner.HeaderOriginTopic: topic,
		runner.HeaderOriginPartition: "0", runner.HeaderOriginOffset: "4", runner.HeaderOriginKey: "k4",
		runner.HeaderErrorType: "*runner.PanicError", runner.HeaderErrorKind: "retryable", runner.HeaderGroup: group,
		runner.HeaderOriginTimestamp: origin[4].Timestamp.Truncate(time.Millisecond).UTC().Format(time.RFC3339Nano)}
	for _, h := range []string{runner.HeaderFirstFailure, runner.HeaderLastFailure} {
		if _, err := time.Parse(time.RFC3339Nano, got[h]); err != nil {
			t.Errorf("header %s = %q: %v", h, got[h], err)
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
	if e := got["tidemark-error"]; e == "" || !containsAll(e, "panicked", "cannot handle 4") {
		t.Errorf("tidemark-error = %q, want the panic", e)
	}
	if string(recs[0].Value) != "4" || string(recs[0].Key) != "k4" {
		t.Errorf("dead-letter record %q=%q, want k4=4", recs[0].Key, recs[0].Value)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		found := false
		for i := 0; i+len(sub) <= len(s); i++ {
			if s[i:i+len(sub)] == sub {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestStall: a wait that moves is not over until it stands still for within
// or has taken stallCap times within; one that stands still is over after
// within.
func TestStall(t *testing.T) {
	t.Parallel()
	const within = time.Second
	st := newStall(within)
	st.total = time.Hour // the cap is checked below
	for i := 0; time.Since(st.start) < 2*within; i++ {
		if st.over(i) {
			t.Fatalf("over after %v while the value moved", time.Since(st.start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.over(-1) {
		t.Fatal("over at once after a change")
	}
	time.Sleep(within + within/2)
	if !st.over(-1) {
		t.Fatalf("not over after %v without a change", within+within/2)
	}
	moving := newStall(within)
	moving.start = moving.start.Add(-stallCap * within)
	if !moving.over("new") {
		t.Fatal("not over after stallCap times within, though the value moved")
	}
}
