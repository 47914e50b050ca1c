package franz_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// flapSink hands out a small budget and, on every hand-over, toggles
// partitions one call at a time, as a runner whose partitions flap around
// their water marks does: it pauses each partition it got records for and
// resumes those it paused on the hand-over before, and pauses and resumes
// a few idle partitions. The pace partition is never paused (its records
// keep the hand-overs coming once every other partition is paused).
type flapSink struct {
	chanSink
	src     *franz.Source
	pace    runner.TP
	idle    []runner.TP
	mu      sync.Mutex
	fetched int         // hand-overs with records
	early   []runner.TP // partitions handed over while paused
	paused  []runner.TP
}

func (s *flapSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	if len(bs) == 0 {
		return 10, nil
	}
	s.mu.Lock()
	s.fetched++
	for _, b := range bs {
		if slices.Contains(s.paused, b.TP) && len(b.Records) > 0 {
			s.early = append(s.early, b.TP)
		}
	}
	s.mu.Unlock()
	// Resumed before the batches are looked at: records handed over
	// on this call may be of partitions resumed just now.
	for _, tp := range s.paused {
		s.src.Resume([]runner.TP{tp})
	}
	s.paused = s.paused[:0]
	for _, b := range bs {
		if b.TP == s.pace {
			continue
		}
		b.Records = slices.Clone(b.Records)
		s.batches <- b
		s.src.Pause([]runner.TP{b.TP})
		s.paused = append(s.paused, b.TP)
	}
	for _, tp := range s.idle {
		s.src.Pause([]runner.TP{tp})
		s.src.Resume([]runner.TP{tp})
	}
	return 10, nil
}

func (s *flapSink) hands() (n int, early []runner.TP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetched, slices.Clone(s.early)
}

// TestFlowTogglesBatchedPerPoll: the source tells the client at most once
// per poll to pause and once to resume, however often the runner toggles
// partitions in between (franz-go copies its whole set of paused partitions
// on each call, so a call per toggle made flapping water marks cost
// O(paused) per toggle); and every record still arrives once, in order.
func TestFlowTogglesBatchedPerPoll(t *testing.T) {
	t.Parallel()
	const parts, per = 8, 100
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", parts)
	c.CreateTopic("idle", 4)
	c.CreateTopic("pace", 1)
	// Ten batches per partition and fetches of one batch per partition:
	// several polls.
	for range 10 {
		produce(c, "t", parts, per/10, 10)
	}
	src, err := franz.New(c.Brokers(), "g", []string{"t", "idle", "pace"}, franz.Logger(kafkatest.Logger(t)),
		franz.ClientOptions(kgo.FetchMaxPartitionBytes(1)))
	if err != nil {
		t.Fatal(err)
	}
	calls := src.CountFlowCalls()
	var idle []runner.TP
	for p := range int32(4) {
		idle = append(idle, runner.TP{Topic: "idle", Partition: p})
	}
	sink := &flapSink{chanSink: chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, parts*per)},
		src: src, idle: idle, pace: runner.TP{Topic: "pace"}}
	runSource(t, src, sink)
	stopPace := make(chan struct{})
	paced := make(chan struct{})
	go func() {
		defer close(paced)
		for {
			select {
			case <-stopPace:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// Not c.produce: t.Fatal is for the test's goroutine, and a
			// failed pace record only slows the test.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c.Client().ProduceSync(ctx, &kgo.Record{Topic: "pace", Value: []byte("x")})
			cancel()
		}
	}()
	defer func() { close(stopPace); <-paced }()
	got := map[runner.TP][]int64{}
	takeBatches(sink.batches, got, 20*time.Second, func() bool {
		n := 0
		for _, offs := range got {
			n += len(offs)
		}
		return n == parts*per
	}, func(runner.Batch) {})
	for p := range int32(parts) {
		tp := runner.TP{Topic: "t", Partition: p}
		if len(got[tp]) != per {
			t.Fatalf("%s got %d records, want %d", tp, len(got[tp]), per)
		}
		for i, o := range got[tp] {
			if o != int64(i) {
				t.Fatalf("%s: record %d has offset %d: lost, repeated or out of order", tp, i, o)
			}
		}
	}
	// Every poll that returned records led to at least one hand-over; the
	// assignment resumes its partitions once.
	hands, early := sink.hands()
	pauses, resumes := calls.Pauses.Load(), calls.Resumes.Load()
	if len(early) > 0 {
		t.Fatalf("records handed over for paused partitions %v", early)
	}
	t.Logf("%d hand-overs, %d client pause calls, %d client resume calls", hands, pauses, resumes)
	if hands < 2*parts {
		t.Fatalf("only %d hand-overs: the budget did not split the records, so the toggles were not tested", hands)
	}
	if pauses > int64(hands)+1 || resumes > int64(hands)+2 {
		t.Fatalf("%d pause and %d resume calls to the client over %d hand-overs: more than one of each per poll", pauses, resumes, hands)
	}
}

// TestResumeEndsIdlePoll: a partition paused at the client and resumed
// while the source waits in a poll with nothing else to fetch gets its
// records at once: the resume, which the source tells the client with its
// next poll, ends the poll that would otherwise wait for data forever.
func TestResumeEndsIdlePoll(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	sink := &chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 100)}
	runSource(t, src, sink)
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	got := map[runner.TP][]int64{}
	take := func(d time.Duration, tp runner.TP, n int) {
		takeBatches(sink.batches, got, d, func() bool { return len(got[tp]) >= n }, func(runner.Batch) {})
	}
	produce(c, "t", 2, 5, 5)
	take(15*time.Second, p0, 5)
	take(5*time.Second, p1, 5)
	produceTo := func(tp runner.TP, n int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for range n {
			if err := c.Client().ProduceSync(ctx, &kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatalf("produce to %s: %v", tp, err)
			}
		}
	}
	src.Pause([]runner.TP{p0})
	// The poll that may have been waiting at the pause ends with this
	// record; the next one tells the client of the pause, and waits with
	// nothing to fetch.
	produceTo(p1, 1)
	take(10*time.Second, p1, 6)
	produceTo(p0, 5)
	take(1500*time.Millisecond, p0, 6) // FetchMaxWait is 500ms: three fetch rounds
	if len(got[p0]) != 5 {
		t.Fatalf("paused partition got %d records, want the 5 from before the pause", len(got[p0]))
	}
	src.Resume([]runner.TP{p0})
	take(5*time.Second, p0, 10)
	if len(got[p0]) != 10 {
		t.Fatalf("resumed partition got %d records in 5s, want 10: the resume did not reach the client", len(got[p0]))
	}
}
