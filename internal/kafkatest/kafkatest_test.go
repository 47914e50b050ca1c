package kafkatest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

type settler struct {
	bare
	got *[]runner.Settlement
}

func (s settler) Settle(_ runner.TP, _ int64, st runner.Settlement) {
	if s.got != nil {
		*s.got = append(*s.got, st)
	}
}

type settlerBoth struct{ both }

func (settlerBoth) Settle(runner.TP, int64, runner.Settlement) {}

// TestWithOptionalSettle: the observer sees each settlement before the
// source does, and the source still gets it.
func TestWithOptionalSettle(t *testing.T) {
	var got []runner.Settlement
	var seen []string
	src := settler{got: &got}
	r := kafkatest.WithOptionalSettle(struct{ runner.Source }{src}, src, func(tp runner.TP, off int64, st runner.Settlement) {
		seen = append(seen, fmt.Sprintf("%s@%d %s", tp, off, st))
	})
	st, ok := r.(runner.Settler)
	if !ok {
		t.Fatal("WithOptionalSettle over a Settler is no Settler")
	}
	st.Settle(runner.TP{Topic: "t", Partition: 1}, 7, runner.Rejected)
	if len(got) != 1 || got[0] != runner.Rejected || len(seen) != 1 || seen[0] != "t/1@7 "+runner.Rejected.String() {
		t.Errorf("source got %v, observer saw %q; want [Rejected] and one observation of t/1@7", got, seen)
	}
}

// TestRunnable: the spy passes on exactly the optional interfaces of the
// source it wraps.
func TestRunnable(t *testing.T) {
	for _, src := range []runner.Source{bare{}, writer{}, limiter{}, both{}, settler{}, settlerBoth{}} {
		_, wantW := src.(runner.DeadLetterWriter)
		_, wantL := src.(runner.FetchLimiter)
		_, wantS := src.(runner.Settler)
		// Any wrapper that embeds runner.Source, as the Spy and
		// sourcetest's contract spy do.
		wrapper := struct{ runner.Source }{src}
		for what, r := range map[string]runner.Source{
			"spy":          kafkatest.NewSpy(src).Runnable(),
			"WithOptional": kafkatest.WithOptional(wrapper, src),
		} {
			_, gotW := r.(runner.DeadLetterWriter)
			_, gotL := r.(runner.FetchLimiter)
			_, gotS := r.(runner.Settler)
			if gotW != wantW || gotL != wantL || gotS != wantS {
				t.Errorf("%T, %s: a DeadLetterWriter %v, FetchLimiter %v, Settler %v; want %v, %v, %v", src, what, gotW, gotL, gotS, wantW, wantL, wantS)
			}
		}
	}
}

func rec(p int32, off int64, key string) runner.Record {
	return runner.Record{Topic: "t", Partition: p, Offset: off, Key: []byte(key)}
}

// TestLedger: each check passes on the handlings it allows and names the
// first it does not.
func TestLedger(t *testing.T) {
	ends := kafkatest.Uniform(2, 2)
	fill := func(recs ...runner.Record) *kafkatest.Ledger {
		l := kafkatest.NewLedger()
		for _, r := range recs {
			l.Add("a", r)
		}
		return l
	}
	once := []runner.Record{rec(0, 0, "x"), rec(1, 0, "y"), rec(0, 1, "x"), rec(1, 1, "y")}
	tests := []struct {
		name                       string
		l                          *kafkatest.Ledger
		exactly, atLeast, key, ord string // "" passes, else a part of the error
	}{
		{"each once in order", fill(once...), "", "", "", ""},
		{"a repeat", fill(append(once, rec(0, 1, "x"))...), "t/0@1 handled 2 times", "", `key "x": t/0@1 handled after offset 1`, "t/0: offset 1 handled after 1"},
		{"a gap", fill(once[:3]...), "t/1@1 handled 0 times", "t/1@1 handled 0 times", "", ""},
		{"past the end", fill(append(once, rec(1, 2, "y"))...), "t/1@2 handled, past the end 2", "", "", ""},
		{"a key on two partitions", fill(rec(0, 0, "x"), rec(1, 0, "x"), rec(0, 1, "z"), rec(1, 1, "y")), "", "", `key "x" handled on t/0 and t/1`, ""},
		{"out of order", fill(rec(0, 1, "x"), rec(0, 0, "x"), rec(1, 0, "y"), rec(1, 1, "y")), "", "", `key "x": t/0@0 handled after offset 1`, "t/0: offset 0 handled after 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for what, c := range map[string]struct {
				err  error
				want string
			}{
				"ExactlyOnce":    {tc.l.ExactlyOnce("t", ends), tc.exactly},
				"AtLeastOnce":    {tc.l.AtLeastOnce("t", ends), tc.atLeast},
				"KeyOrder":       {tc.l.KeyOrder(), tc.key},
				"PartitionOrder": {tc.l.PartitionOrder(), tc.ord},
			} {
				switch {
				case c.want == "" && c.err != nil:
					t.Errorf("%s: %v, want nil", what, c.err)
				case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
					t.Errorf("%s: %v, want an error with %q", what, c.err, c.want)
				}
			}
		})
	}
}

// TestLedgerHandler: the handler counts by member and partition, running
// while the wrapped handler runs and completed only when it returns nil.
func TestLedgerHandler(t *testing.T) {
	l := kafkatest.NewLedger()
	var runningInside int
	fail := errors.New("fail")
	h := l.Handler("a", func(_ context.Context, r runner.Record) error {
		runningInside = l.Running("a")
		if r.Offset == 1 {
			return fail
		}
		return nil
	})
	for off := range int64(3) {
		if err := h(context.Background(), rec(0, off, "")); (err != nil) != (off == 1) {
			t.Fatalf("offset %d: handler returned %v", off, err)
		}
	}
	if err := l.Handler("b", nil)(context.Background(), rec(0, 1, "")); err != nil {
		t.Fatal(err)
	}
	tp := runner.TP{Topic: "t", Partition: 0}
	switch {
	case runningInside != 1 || l.Running("a") != 0:
		t.Errorf("running %d inside the handler and %d after, want 1 and 0", runningInside, l.Running("a"))
	case l.Count() != 4 || l.CountBy("a") != 3 || l.CountBy("b") != 1:
		t.Errorf("counts %d, a %d, b %d; want 4, 3, 1", l.Count(), l.CountBy("a"), l.CountBy("b"))
	case l.Completed(tp) != 3:
		t.Errorf("%d completed, want 3 (the failed call is not)", l.Completed(tp))
	case !slices.Equal(l.HandledBy(tp, 1), []string{"a", "b"}) || !slices.Equal(l.Offsets(tp), []int64{0, 1, 2}):
		t.Errorf("offset 1 handled by %v, offsets %v", l.HandledBy(tp, 1), l.Offsets(tp))
	}
}

// TestLedgerValues: ValuesOnce names a value not wanted, a repeat and a
// value never handled.
func TestLedgerValues(t *testing.T) {
	want := map[string]bool{"a": true, "b": true, "x": false}
	for _, tc := range []struct {
		values []string
		err    string
	}{
		{[]string{"b", "a"}, ""},
		{[]string{"a", "b", "x"}, `value "x" handled 1 times, want none`},
		{[]string{"a", "b", "c"}, `value "c" handled 1 times, want none`},
		{[]string{"a", "b", "a"}, `value "a" handled 2 times, want once`},
		{[]string{"a"}, `value "b" never handled`},
	} {
		l := kafkatest.NewLedger()
		for i, v := range tc.values {
			l.Add("", runner.Record{Topic: "t", Offset: int64(i), Value: []byte(v)})
		}
		err := l.ValuesOnce(want)
		if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("values %q: %v, want %q", tc.values, err, tc.err)
		}
	}
}
