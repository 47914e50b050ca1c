package kafkatest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func commit(t *testing.T, c *kafkatest.Cluster, group, topic string, p int32, at int64) {
	t.Helper()
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Admin().CommitOffsets(ctx, group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("commit %s/%d@%d: %v", topic, p, at, err)
	}
}

// TestOffsets: a new topic's partitions end at the records produced to
// them, an unknown group has committed nothing (-1, not 0), and AtEnd holds
// only once every partition's end is committed.
func TestOffsets(t *testing.T) {
	c := kafkatest.NewFake(t)
	topic := c.Topic(2)
	c.Produce(kafkatest.Spread(topic, 2, 3, func(p int32, i int) string { return "k" })...)
	c.ProduceKeyed(topic, 4, nil)
	ends := c.Ends(topic)
	if len(ends) != 2 || ends[0]+ends[1] != 10 || ends[0] < 3 || ends[1] < 3 {
		t.Fatalf("end offsets %v, want two partitions holding 3+3+4 records", ends)
	}
	for p, off := range c.Committed("nobody", topic) {
		if off != -1 {
			t.Errorf("unknown group: partition %d committed %d, want -1", p, off)
		}
	}
	commit(t, c, "g", topic, 0, ends[0])
	if c.AtEnd("g", topic)() {
		t.Fatal("AtEnd with partition 1 uncommitted")
	}
	if got := c.Committed("g", topic); got[0] != ends[0] || got[1] != -1 {
		t.Fatalf("committed %v, want %d and -1", got, ends[0])
	}
	commit(t, c, "g", topic, 1, ends[1])
	if !c.AtEnd("g", topic)() {
		t.Fatal("AtEnd false with every end committed")
	}
}

// TestSamplerBackward: the sampler sees a committed offset go from 5 to 3.
func TestSamplerBackward(t *testing.T) {
	c := kafkatest.NewFake(t)
	topic := c.Topic(1)
	c.Produce(kafkatest.Spread(topic, 1, 10, nil)...)
	s := c.Sample("g", topic, 10*time.Millisecond)
	commit(t, c, "g", topic, 0, 5)
	kafkatest.WaitFor(t, 5*time.Second, "the sample of 5", func() bool { return s.Changes() == 1 })
	if b := s.Backward(); b != "" {
		t.Fatalf("Backward after one commit: %s", b)
	}
	commit(t, c, "g", topic, 0, 3)
	kafkatest.WaitFor(t, 5*time.Second, "the sample of 3", func() bool { return s.Changes() == 2 })
	s.Close()
	if b := s.Backward(); !strings.Contains(b, "committed 3") || !strings.Contains(b, "after 5") {
		t.Fatalf("Backward = %q, want 3 after 5", b)
	}
	if s.Polls() < 2 || len(s.Errs()) != 0 {
		t.Fatalf("%d polls, errors %v", s.Polls(), s.Errs())
	}
	if h := s.History()[0]; len(h) != 2 || h[0].Offset != 5 || h[1].Offset != 3 {
		t.Fatalf("history %v, want 5 then 3", h)
	}
}

func TestName(t *testing.T) {
	a, b := kafkatest.Name(t, "topic"), kafkatest.Name(t, "topic")
	if a == b || !strings.HasPrefix(a, "topic-TestName-") {
		t.Fatalf("names %q and %q: want distinct names after topic-TestName-", a, b)
	}
}

type bare struct{ runner.Source }

type writer struct{ bare }

func (writer) WriteDeadLetter(context.Context, string, runner.Record) error { return nil }

type limiter struct{ bare }

func (limiter) LimitFetch(runner.FetchLimits) error { return nil }

type both struct{ writer }

func (both) LimitFetch(runner.FetchLimits) error { return nil }

// TestRunnable: the spy passes on exactly the optional interfaces of the
// source it wraps.
func TestRunnable(t *testing.T) {
	for _, src := range []runner.Source{bare{}, writer{}, limiter{}, both{}} {
		_, wantW := src.(runner.DeadLetterWriter)
		_, wantL := src.(runner.FetchLimiter)
		// Any wrapper that embeds runner.Source, as the Spy and
		// sourcetest's contract spy do.
		wrapper := struct{ runner.Source }{src}
		for what, r := range map[string]runner.Source{
			"spy":          kafkatest.NewSpy(src).Runnable(),
			"WithOptional": kafkatest.WithOptional(wrapper, src),
		} {
			_, gotW := r.(runner.DeadLetterWriter)
			_, gotL := r.(runner.FetchLimiter)
			if gotW != wantW || gotL != wantL {
				t.Errorf("%T, %s: a DeadLetterWriter %v, FetchLimiter %v; want %v, %v", src, what, gotW, gotL, wantW, wantL)
			}
		}
	}
}
