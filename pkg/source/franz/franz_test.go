package franz_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/watermark"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// produce writes perPartition records to each of partitions of topic,
// keyed k<partition>-<i%keys> (see kafkatest.Spread).
func produce(c *kafkatest.Cluster, topic string, partitions int32, perPartition, keys int) {
	c.Produce(kafkatest.Spread(topic, partitions, perPartition, func(p int32, i int) string {
		return fmt.Sprintf("k%d-%d", p, i%keys)
	})...)
}

// member is one runner over one spied franz Source.
type member struct {
	*kafkatest.Member
	src *franz.Source
}

func startMember(t *testing.T, c *kafkatest.Cluster, group string, topics []string, h runner.Handler, fopts []franz.Option, ropts ...runner.Option) *member {
	t.Helper()
	fopts = append([]franz.Option{
		franz.Logger(kafkatest.Logger(t)),
		franz.SessionTimeout(3 * time.Second),
		franz.HeartbeatInterval(300 * time.Millisecond),
		franz.RebalanceTimeout(10 * time.Second),
	}, fopts...)
	src, err := franz.New(c.Brokers(), group, topics, fopts...)
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	opts := []runner.Option{
		runner.Logger(kafkatest.Logger(t)),
		runner.CommitInterval(50 * time.Millisecond),
		runner.DrainBudget(3 * time.Second),
		runner.Concurrency(8),
	}
	for _, tp := range topics {
		opts = append(opts, runner.Handle(tp, h))
	}
	return &member{Member: kafkatest.Start(t, "", src, 15*time.Second, append(opts, ropts...)...), src: src}
}

// TestConsumeCommitsEnd: one runner consumes every keyed record once, in
// per-key offset order, and commits the end offsets, with each group
// protocol the adapter offers.
func TestConsumeCommitsEnd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		opts []franz.Option
	}{
		{"cooperative", nil},
		{"eager", []franz.Option{franz.Eager()}},
		{"static", []franz.Option{franz.InstanceID("member-1")}},
		{"kip848", []franz.Option{franz.ServerSideAssignment()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const parts, per = 3, 200
			c := kafkatest.NewFake(t)
			c.CreateTopic("orders", parts)
			produce(c, "orders", parts, per, 7)
			l := kafkatest.NewLedger()
			m := startMember(t, c, "g", []string{"orders"}, l.Handler("", nil), tc.opts)
			kafkatest.WaitFor(t, 20*time.Second, "every record handled", func() bool { return l.Count() >= parts*per })
			kafkatest.WaitFor(t, 10*time.Second, "committed == end offsets", c.AtEnd("g", "orders"))
			m.Stop(t)

			if err := l.ExactlyOnce("orders", kafkatest.Uniform(parts, per)); err != nil {
				t.Error(err)
			}
			if err := l.KeyOrder(); err != nil {
				t.Error(err)
			}
			for p, end := range c.Ends("orders") {
				if end != per {
					t.Errorf("orders/%d end %d, want %d", p, end, per)
				}
			}
		})
	}
}

// TestTwoMembersShare: two runners in one group split the partitions; when
// one shuts down the other takes them all, and together they handle every
// record and commit the end offsets.
func TestTwoMembersShare(t *testing.T) {
	t.Parallel()
	const parts = 4
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", parts)
	l := kafkatest.NewLedger()
	m1 := startMember(t, c, "g", []string{"t"}, l.Handler("1", nil), nil)
	m2 := startMember(t, c, "g", []string{"t"}, l.Handler("2", nil), nil)
	kafkatest.WaitFor(t, 20*time.Second, "both members own partitions", func() bool {
		a, b := m1.Spy.Owned(), m2.Spy.Owned()
		return len(a) > 0 && len(b) > 0 && len(a)+len(b) == parts
	})
	produce(c, "t", parts, 100, 5)
	kafkatest.WaitFor(t, 20*time.Second, "first batch handled", func() bool { return l.Count() >= parts*100 })
	if l.CountBy("1") == 0 || l.CountBy("2") == 0 {
		t.Fatalf("members handled %d and %d records; want both > 0", l.CountBy("1"), l.CountBy("2"))
	}

	m1.Stop(t)
	kafkatest.WaitFor(t, 20*time.Second, "the remaining member owns every partition", func() bool { return len(m2.Spy.Owned()) == parts })
	produce(c, "t", parts, 100, 5)
	kafkatest.WaitFor(t, 20*time.Second, "committed == end offsets", c.AtEnd("g", "t"))
	m2.Stop(t)

	if err := l.AtLeastOnce("t", kafkatest.Uniform(parts, 200)); err != nil {
		t.Error(err)
	}
}

// TestDeadLetter: a record that fails every attempt is written to the
// dead-letter topic through the Source, with its key, value and headers, and
// only then committed past.
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("in", 1)
	c.CreateTopic("dlq", 1)
	produce(c, "in", 1, 10, 10)
	l := kafkatest.NewLedger()
	fail := func(ctx context.Context, rec runner.Record) error {
		if string(rec.Key) == "k0-3" {
			return errors.New("boom")
		}
		l.Add("", rec)
		return nil
	}
	m := startMember(t, c, "g", []string{"in"}, fail, nil,
		runner.Failure(runner.DeadLetter("dlq", 2, nil)), runner.Backoff(time.Millisecond, 5*time.Millisecond))
	kafkatest.WaitFor(t, 20*time.Second, "committed == end offsets", c.AtEnd("g", "in"))
	m.Stop(t)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics("dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	for len(got) < 1 && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	if len(got) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", len(got))
	}
	r := got[0]
	if string(r.Key) != "k0-3" || string(r.Value) != "3" {
		t.Errorf("dead letter key %q value %q, want k0-3 and 3", r.Key, r.Value)
	}
	hdr := map[string]string{}
	for _, x := range r.Headers {
		hdr[x.Key] = string(x.Value)
	}
	for k, want := range map[string]string{"i": "3", "tidemark-origin-topic": "in", "tidemark-origin-partition": "0", "tidemark-origin-offset": "3", "tidemark-attempts": "2"} {
		if hdr[k] != want {
			t.Errorf("dead letter header %s = %q, want %q (headers %v)", k, hdr[k], want, hdr)
		}
	}
	if l.Count() != 9 {
		t.Errorf("handled %d records, want 9", l.Count())
	}
}

// TestDeadLetterMissingTopic: a write to a topic that does not exist fails
// with the broker's error instead of hanging.
func TestDeadLetterMissingTopic(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	src, err := franz.New(c.Brokers(), "g", []string{"in"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = src.WriteDeadLetter(ctx, "nope", runner.Record{Topic: "in", Key: []byte("k"), Value: []byte("v")})
	if !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("WriteDeadLetter to a missing topic: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
}

// chanSink is a Sink without a runner: it answers at once and passes every
// batch on.
type chanSink struct {
	assigned chan []runner.Assignment
	batches  chan runner.Batch
}

func (s *chanSink) Assigned(_ context.Context, parts []runner.Assignment) error {
	s.assigned <- parts
	return nil
}
func (s *chanSink) Revoked(context.Context, []runner.TP, time.Time) error { return nil }
func (s *chanSink) Lost(context.Context, []runner.TP) error               { return nil }
func (s *chanSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	for _, b := range bs {
		// The source may reuse the records' memory once Fetched returned.
		b.Records = slices.Clone(b.Records)
		s.batches <- b
	}
	return 100, nil
}

// runSource runs src with sink until the test ends, then closes it and
// checks what Run returned.
func runSource(t *testing.T, src *franz.Source, sink runner.Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- src.Run(ctx, sink) }()
	t.Cleanup(func() {
		src.Close()
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// takeBatches receives batches, adding their offsets to got and passing
// each to check, until until holds or d has passed.
func takeBatches(batches <-chan runner.Batch, got map[runner.TP][]int64, d time.Duration, until func() bool, check func(runner.Batch)) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for !until() {
		select {
		case b := <-batches:
			for _, r := range b.Records {
				got[b.TP] = append(got[b.TP], r.Offset)
			}
			check(b)
		case <-timer.C:
			return
		}
	}
}

// TestPause: a paused partition gets no records until it is resumed, while
// the others keep flowing; batches carry the position and high watermark.
func TestPause(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	sink := &chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 1000)}
	runSource(t, src, sink)

	select {
	case as := <-sink.assigned:
		if len(as) != 2 {
			t.Fatalf("assigned %v, want both partitions", as)
		}
		for _, a := range as {
			if a.Start != watermark.Unknown {
				t.Errorf("%s start %d, want watermark.Unknown", a.TP, a.Start)
			}
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no assignment")
	}
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	src.Pause([]runner.TP{p0})
	produce(c, "t", 2, 10, 10)

	got := map[runner.TP][]int64{}
	take := func(d time.Duration, until func() bool) {
		takeBatches(sink.batches, got, d, until, func(b runner.Batch) {
			if last := b.Records[len(b.Records)-1].Offset; b.Position != last+1 {
				t.Errorf("%s batch position %d, want %d", b.TP, b.Position, last+1)
			}
			if b.HighWatermark != 10 {
				t.Errorf("%s high watermark %d, want 10", b.TP, b.HighWatermark)
			}
		})
	}
	take(10*time.Second, func() bool { return len(got[p1]) == 10 })
	if len(got[p1]) != 10 {
		t.Fatalf("unpaused partition got %d records, want 10", len(got[p1]))
	}
	take(1500*time.Millisecond, func() bool { return false }) // FetchMaxWait is 500ms: three fetch rounds
	if len(got[p0]) != 0 {
		t.Fatalf("paused partition got records %v", got[p0])
	}
	src.Resume([]runner.TP{p0})
	take(10*time.Second, func() bool { return len(got[p0]) == 10 })
	if len(got[p0]) != 10 {
		t.Fatalf("resumed partition got %d records, want 10", len(got[p0]))
	}
}

// pauseSink hands out a small budget and pauses one partition when the
// first of its records arrives, as a runner does when a partition reaches
// its high water mark while the source still holds more of its records.
type pauseSink struct {
	chanSink
	src    *franz.Source
	tp     runner.TP
	paused bool
}

func (s *pauseSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	for _, b := range bs {
		b.Records = slices.Clone(b.Records)
		s.batches <- b
		if b.TP == s.tp && !s.paused {
			s.paused = true
			s.src.Pause([]runner.TP{s.tp})
		}
	}
	return 5, nil
}

// TestPauseWhileHeld: records the source took from the client for a
// partition that is paused afterwards are not handed over until it is
// resumed — the source keeps them across its next polls, and the client
// does not fetch that partition meanwhile — and then they come in offset
// order, none lost or repeated, with the position after the last.
func TestPauseWhileHeld(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	produce(c, "t", 2, 200, 10) // before the start: the first poll takes them all
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	sink := &pauseSink{chanSink: chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 10000)},
		src: src, tp: p0}
	runSource(t, src, sink)
	got := map[runner.TP][]int64{}
	last := map[runner.TP]int64{}
	take := func(d time.Duration, until func() bool) {
		takeBatches(sink.batches, got, d, until, func(b runner.Batch) {
			switch {
			case b.Position == -1 && len(b.Records) == 0:
				t.Errorf("%s: an empty batch without a position", b.TP)
			case b.Position != -1 && len(b.Records) > 0 && b.Position != b.Records[len(b.Records)-1].Offset+1:
				t.Errorf("%s: position %d after offset %d", b.TP, b.Position, b.Records[len(b.Records)-1].Offset)
			case b.Position != -1:
				last[b.TP] = b.Position
			}
		})
	}
	take(15*time.Second, func() bool { return len(got[p1]) == 200 })
	if len(got[p1]) != 200 {
		t.Fatalf("unpaused partition got %d records, want 200", len(got[p1]))
	}
	held := len(got[p0])
	if held == 0 || held > 5 {
		t.Fatalf("partition 0 got %d records before its pause, want 1 to 5 (one hand-over)", held)
	}
	// More records while partition 0 is paused: partition 1 gets them,
	// partition 0 nothing, over several polls (parkWait is 10ms,
	// FetchMaxWait 500ms).
	produce(c, "t", 2, 50, 10)
	take(10*time.Second, func() bool { return len(got[p1]) == 250 })
	take(1500*time.Millisecond, func() bool { return false })
	if len(got[p1]) != 250 || len(got[p0]) != held {
		t.Fatalf("while paused: partition 1 got %d records (want 250), partition 0 %d (want %d)", len(got[p1]), len(got[p0]), held)
	}
	src.Resume([]runner.TP{p0})
	take(10*time.Second, func() bool { return len(got[p0]) >= 250 })
	take(500*time.Millisecond, func() bool { return false })
	for _, tp := range []runner.TP{p0, p1} {
		if len(got[tp]) != 250 {
			t.Errorf("%s got %d records, want 250", tp, len(got[tp]))
		}
		for i, o := range got[tp] {
			if o != int64(i) {
				t.Fatalf("%s: record %d has offset %d: lost, repeated or out of order (%v)", tp, i, o, got[tp])
			}
		}
		if last[tp] != 250 {
			t.Errorf("%s: last position %d, want 250", tp, last[tp])
		}
	}
}

// TestTransactions: records of aborted transactions are never handled,
// committed ones exactly once, and the committed offset reaches the end of
// the partition past the last transaction marker (lag 0).
func TestTransactions(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("tx", 1)
	p, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.TransactionalID("tx-1"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := map[string]bool{}
	for txn, commit := range []bool{true, false, true, false} {
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			v := fmt.Sprintf("txn%d-%d", txn, i)
			if err := p.ProduceSync(ctx, &kgo.Record{Topic: "tx", Key: []byte(v), Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if commit {
				want[v] = true
			}
		}
		if err := p.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	l := kafkatest.NewLedger()
	m := startMember(t, c, "g", []string{"tx"}, l.Handler("", nil), nil)
	kafkatest.WaitFor(t, 20*time.Second, "committed == end offset", c.AtEnd("g", "tx"))
	m.Stop(t)
	if end := c.Ends("tx")[0]; end != 24 {
		t.Errorf("end offset %d, want 24 (20 records and 4 markers)", end)
	}
	if err := l.ValuesOnce(want); err != nil {
		t.Errorf("%v (committed transactions' records are wanted once, aborted ones never)", err)
	}
}

// TestLost: when the broker tells the member it is unknown (its session
// ended), the partition is reported lost, the in-flight handler's ctx is
// cancelled, and its late completion commits nothing: the committed offset
// stays below the unfinished record until the new assignment finishes it.
func TestLost(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	produce(c, "t", 1, 10, 10)

	const stuck = 5
	var (
		mu        sync.Mutex
		calls     int
		cancelled = make(chan struct{}) // closed when the first attempt's ctx ends
		release1  = make(chan struct{}) // lets the first attempt return (late)
		release2  = make(chan struct{}) // lets the redelivery return
	)
	h := func(ctx context.Context, rec runner.Record) error {
		if rec.Offset != stuck {
			return nil
		}
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			<-ctx.Done()
			close(cancelled)
			<-release1
			return nil // a late success: must not count
		}
		<-release2
		return nil
	}
	m := startMember(t, c, "g", []string{"t"}, h,
		[]franz.Option{franz.SessionTimeout(time.Second), franz.HeartbeatInterval(100 * time.Millisecond), franz.RebalanceTimeout(2 * time.Second)})
	tp := runner.TP{Topic: "t", Partition: 0}
	kafkatest.WaitFor(t, 20*time.Second, "commit up to the stuck record", func() bool { return c.Committed("g", tp.Topic)[tp.Partition] == stuck })

	c.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: "g", Err: kerr.UnknownMemberID})
	kafkatest.WaitFor(t, 20*time.Second, "the partition reported lost", func() bool { return len(m.Spy.Lost()) > 0 })
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the lost partition's handler ctx was not cancelled")
	}
	close(release1)
	// The member rejoins and gets the partition back; the redelivered
	// record is held, so nothing may pass it.
	kafkatest.WaitFor(t, 20*time.Second, "the redelivery", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 2 })
	time.Sleep(500 * time.Millisecond) // ten commit intervals
	if got := c.Committed("g", tp.Topic)[tp.Partition]; got != stuck {
		t.Fatalf("committed %d after the lost attempt finished late; want %d", got, stuck)
	}
	close(release2)
	kafkatest.WaitFor(t, 20*time.Second, "committed == end offsets", c.AtEnd("g", "t"))
	m.Stop(t)
}

// TestNewValidates: New refuses bad arguments and options with a
// *ConfigError naming them.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		brokers []string
		group   string
		topics  []string
		opts    []franz.Option
		option  string
	}{
		{"no brokers", nil, "g", []string{"t"}, nil, "brokers"},
		{"no group", []string{"x:1"}, "", []string{"t"}, nil, "group"},
		{"no topics", []string{"x:1"}, "g", nil, nil, "topics"},
		{"twice", []string{"x:1"}, "g", []string{"t", "t"}, nil, "topics"},
		{"instance", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.InstanceID("")}, "InstanceID"},
		{"balancer", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Balancer()}, "Balancer"},
		{"session", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.SessionTimeout(0)}, "SessionTimeout"},
		{"rebalance", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.RebalanceTimeout(-1)}, "RebalanceTimeout"},
		{"heartbeat", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.HeartbeatInterval(time.Minute)}, "HeartbeatInterval"},
		{"poll", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.MaxPollRecords(0)}, "MaxPollRecords"},
		{"logger", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Logger(nil)}, "Logger"},
		{"848 eager", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Eager(), franz.ServerSideAssignment()}, "ServerSideAssignment"},
		{"848 cooperative", []string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Balancer(kgo.CooperativeStickyBalancer()), franz.ServerSideAssignment()}, "ServerSideAssignment"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, err := franz.New(tc.brokers, tc.group, tc.topics, tc.opts...)
			if err == nil {
				src.Close()
				t.Fatal("New accepted it")
			}
			var ce *franz.ConfigError
			if !errors.As(err, &ce) || ce.Option != tc.option {
				t.Fatalf("New: %v, want a *ConfigError for %s", err, tc.option)
			}
		})
	}
	if _, err := franz.New([]string{"x:1"}, "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.ClientOptions(kgo.ConsumeRegex())); !errors.As(err, new(*franz.ConfigError)) {
		t.Errorf("New with kgo.ConsumeRegex: %v, want a *ConfigError", err)
	}
	src, err := franz.New([]string{"x:1"}, "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.ClientOptions(kgo.SeedBrokers("bad:host:port")))
	if err != nil {
		t.Fatalf("New with a later valid SeedBrokers: %v", err)
	}
	src.Close()
}

// TestNewArgumentMessages: New's messages for bad arguments and balancer
// lists, word for word, and which of two bad arguments it names first. An
// empty broker address is refused: franz-go would dial it as localhost:9092.
func TestNewArgumentMessages(t *testing.T) {
	t.Parallel()
	cases := []struct {
		brokers []string
		group   string
		topics  []string
		opts    []franz.Option
		want    string
	}{
		{nil, "", nil, nil, "franz: option brokers: no seed broker"},
		{[]string{"x:1"}, "", nil, nil, "franz: option group: empty group"},
		{[]string{"x:1"}, "g", nil, nil, "franz: option topics: no topic"},
		{[]string{"x:1", ""}, "g", []string{"t"}, nil, "franz: option brokers: broker 1 is empty"},
		{[]string{"x:1"}, "g", []string{"t", ""}, nil, "franz: option topics: topic 1 is empty"},
		{[]string{"x:1"}, "g", []string{"t", "u", "t", ""}, nil, `franz: option topics: topic "t" given twice`},
		{[]string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Balancer()}, "franz: option Balancer: no balancer given"},
		{[]string{"x:1"}, "g", []string{"t"}, []franz.Option{franz.Balancer(kgo.RangeBalancer(), nil)}, "franz: option Balancer: balancer 1 is nil"},
	}
	for _, tc := range cases {
		src, err := franz.New(tc.brokers, tc.group, tc.topics, append([]franz.Option{franz.Logger(kafkatest.Logger(t))}, tc.opts...)...)
		if err == nil {
			src.Close()
			t.Errorf("New(%q, %q, %q) accepted it, want %q", tc.brokers, tc.group, tc.topics, tc.want)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("New(%q, %q, %q): %q, want %q", tc.brokers, tc.group, tc.topics, err, tc.want)
		}
	}
}

// recSink is a Sink without a runner that records ownership reports.
type recSink struct {
	mu       sync.Mutex
	assigned []runner.TP
	lost     []runner.TP
}

func (s *recSink) Assigned(_ context.Context, parts []runner.Assignment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range parts {
		s.assigned = append(s.assigned, a.TP)
	}
	return nil
}
func (s *recSink) Revoked(context.Context, []runner.TP, time.Time) error { return nil }
func (s *recSink) Lost(_ context.Context, tps []runner.TP) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost = append(s.lost, tps...)
	return nil
}
func (s *recSink) Fetched(context.Context, []runner.Batch) (int, error) { return 100, nil }

func (s *recSink) counts() (assigned, lost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.assigned), len(s.lost)
}

// TestNoCommitAfterLost: once a partition is reported lost, Commit sends
// nothing for it (even while the client rejoins) and says so with
// ErrNotOwned; after it is assigned again, commits go through.
func TestNoCommitAfterLost(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)),
		franz.SessionTimeout(time.Second), franz.HeartbeatInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	runSource(t, src, sink)
	tp := runner.TP{Topic: "t", Partition: 0}
	kafkatest.WaitFor(t, 15*time.Second, "the assignment", func() bool { a, _ := sink.counts(); return a == 1 })
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if err := src.Commit(cctx, []runner.Offset{{TP: tp, Offset: 3}}); err != nil {
		t.Fatalf("Commit while owned: %v", err)
	}

	// Keep the member out of the group after it loses its session.
	joins := c.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: "g", Count: -1})
	c.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: "g", Err: kerr.UnknownMemberID})
	kafkatest.WaitFor(t, 15*time.Second, "the loss", func() bool { _, l := sink.counts(); return l == 1 })
	err = src.Commit(cctx, []runner.Offset{{TP: tp, Offset: 7}})
	var ce *franz.CommitError
	if !errors.Is(err, franz.ErrNotOwned) || !errors.As(err, &ce) || len(ce.NotOwned) != 1 || ce.NotOwned[0] != tp {
		t.Fatalf("Commit after the loss: %v, want a *CommitError with %s not owned", err, tp)
	}
	if got := c.Committed("g", tp.Topic)[tp.Partition]; got != 3 {
		t.Fatalf("committed %d after the loss, want 3", got)
	}

	joins.Remove()
	kafkatest.WaitFor(t, 15*time.Second, "the new assignment", func() bool { a, _ := sink.counts(); return a == 2 })
	if err := src.Commit(cctx, []runner.Offset{{TP: tp, Offset: 7}}); err != nil {
		t.Fatalf("Commit after the new assignment: %v", err)
	}
	if got := c.Committed("g", tp.Topic)[tp.Partition]; got != 7 {
		t.Fatalf("committed %d, want 7", got)
	}
}

// hookLog records the assignments an assign hook sees.
type hookLog struct {
	mu  sync.Mutex
	got []runner.Assignment
}

func (l *hookLog) hook(_ context.Context, a runner.Assignment) (runner.Applied, error) {
	l.mu.Lock()
	l.got = append(l.got, a)
	l.mu.Unlock()
	return nil, nil
}

func (l *hookLog) all() []runner.Assignment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// TestAssignmentGeneration: each assignment carries the classic group
// generation it was made in and the member id, so an assign hook can tell
// the newer of two assignments of a partition: a partition that moves to
// a second member is assigned there in a later generation than the first
// member got it in. Under KIP-848 franz-go has only the member epoch,
// which is not the assignment's generation: the adapter reports none (-1).
func TestAssignmentGeneration(t *testing.T) {
	t.Parallel()
	const parts = 4
	t.Run("classic", func(t *testing.T) {
		c := kafkatest.NewFake(t)
		c.CreateTopic("t", parts)
		var l1, l2 hookLog
		m1 := startMember(t, c, "g", []string{"t"}, func(context.Context, runner.Record) error { return nil }, nil, runner.OnAssign(runner.PerPartition(l1.hook)))
		kafkatest.WaitFor(t, 20*time.Second, "the first member owns every partition", func() bool { return len(l1.all()) == parts })
		first := map[runner.TP]runner.Assignment{}
		for _, a := range l1.all() {
			if a.Generation < 1 || a.Member == "" {
				t.Fatalf("first member's assignment %+v: want a generation ≥ 1 and a member id", a)
			}
			if a.Generation != l1.all()[0].Generation || a.Member != l1.all()[0].Member {
				t.Fatalf("one rebalance's assignments differ: %+v", l1.all())
			}
			first[a.TP] = a
		}
		startMember(t, c, "g", []string{"t"}, func(context.Context, runner.Record) error { return nil }, nil, runner.OnAssign(runner.PerPartition(l2.hook)))
		kafkatest.WaitFor(t, 20*time.Second, "the second member owns partitions", func() bool { return len(l2.all()) > 0 && len(m1.Spy.Owned()) < parts })
		for _, a := range l2.all() {
			prev := first[a.TP]
			if a.Member == "" || a.Member == prev.Member {
				t.Errorf("moved %s: member %q, want a member id other than the first member's %q", a.TP, a.Member, prev.Member)
			}
			if a.Generation <= prev.Generation {
				t.Errorf("moved %s: generation %d, want above the first member's %d", a.TP, a.Generation, prev.Generation)
			}
		}
	})
	t.Run("kip848", func(t *testing.T) {
		c := kafkatest.NewFake(t)
		c.CreateTopic("t", parts)
		var l hookLog
		startMember(t, c, "g", []string{"t"}, func(context.Context, runner.Record) error { return nil },
			[]franz.Option{franz.ServerSideAssignment()}, runner.OnAssign(runner.PerPartition(l.hook)))
		kafkatest.WaitFor(t, 20*time.Second, "the member owns every partition", func() bool { return len(l.all()) == parts })
		for _, a := range l.all() {
			if a.Generation != runner.NoGeneration || a.Member == "" {
				t.Errorf("assignment %+v: want generation -1 (unknown under KIP-848) and a member id", a)
			}
		}
	})
}

// TestKeptAcrossRejoin: when the coordinator removes a member (its session
// expired while the process was stopped, here an admin LeaveGroup) and the
// member learns it from a refused commit, franz-go rejoins under a new
// member id and keeps the partitions the new session gives it back as if
// they had never left. They did: another member could have owned them in
// between, handled records, committed and taken their inbox leases. The
// source reports them lost and assigns them anew — the assign hook runs
// again (the inbox takes its lease back) and the new assignment starts at
// the group's committed offset — instead of going on under the old epoch.
// Without that a chaos run stalled: the member kept partitions whose inbox
// leases another member had bumped, and every record was fenced.
//
// The coordinator may refuse the commit as from an unknown member (the
// path under test) or, once the removal bumped the generation, as of an
// illegal generation: franz-go then loses the partition itself and
// assigns it afresh, its start read only as it fetches. The test tries
// up to five times until the member took the first path.
func TestKeptAcrossRejoin(t *testing.T) {
	t.Parallel()
	for attempt := range 5 {
		if keptAcrossRejoin(t, attempt) {
			return
		}
	}
	t.Fatal("in 5 attempts the member never kept its partition across the rejoin (every refused commit was an illegal generation): the path under test was not exercised")
}

// keptAcrossRejoin runs one attempt of TestKeptAcrossRejoin; false when
// the member did not keep its partition across the rejoin.
func keptAcrossRejoin(t *testing.T, attempt int) bool {
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	produce(c, "t", 1, 200, 10)
	tp := runner.TP{Topic: "t", Partition: 0}
	var l hookLog
	slow := func(ctx context.Context, _ runner.Record) error {
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}
	kept := &sawLog{Handler: kafkatest.Logger(t).Handler(), want: "partitions kept across a rejoin", saw: &atomic.Bool{}}
	group := fmt.Sprintf("g%d", attempt)
	// Heartbeats rarely, commits often: the refused commit, not a
	// heartbeat, tells the member it was removed.
	m := startMember(t, c, group, []string{"t"}, slow,
		[]franz.Option{franz.SessionTimeout(10 * time.Second), franz.HeartbeatInterval(9 * time.Second), franz.Logger(slog.New(kept))},
		runner.OnAssign(runner.PerPartition(l.hook)), runner.CommitInterval(5*time.Millisecond), runner.Concurrency(1))
	defer m.Stop(t)
	kafkatest.WaitFor(t, 20*time.Second, "the first assignment and some commits", func() bool {
		return len(l.all()) == 1 && c.Committed(group, tp.Topic)[tp.Partition] >= 20
	})
	oldID, _ := m.src.Client().GroupMetadata()

	c.Evict(group, oldID)

	kafkatest.WaitFor(t, 20*time.Second, "the partition assigned again under a new member id", func() bool {
		all := l.all()
		return len(all) >= 2 && all[len(all)-1].Member != oldID
	})
	if !kept.saw.Load() {
		t.Logf("attempt %d: the member lost its partition through franz-go, not kept across the rejoin; again", attempt)
		return false
	}
	again := l.all()[1]
	if again.TP != tp || again.Member == oldID || again.Member == "" {
		t.Fatalf("second assignment %+v: want %s under a new member id (was %s)", again, tp, oldID)
	}
	if len(m.Spy.Lost()) == 0 {
		t.Fatal("the partition kept across the rejoin was never reported lost")
	}
	if again.Start < 0 {
		t.Errorf("second assignment starts at %d, want the committed offset", again.Start)
	}
	kafkatest.WaitFor(t, 30*time.Second, "committed == end offsets", c.AtEnd(group, "t"))
	return true
}

// sawLog notes whether a record whose message starts with want was
// logged.
type sawLog struct {
	slog.Handler
	want string
	saw  *atomic.Bool
}

func (l *sawLog) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, l.want) {
		l.saw.Store(true)
	}
	return l.Handler.Handle(ctx, r)
}

func (l *sawLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &sawLog{Handler: l.Handler.WithAttrs(as), want: l.want, saw: l.saw}
}

func (l *sawLog) WithGroup(name string) slog.Handler {
	return &sawLog{Handler: l.Handler.WithGroup(name), want: l.want, saw: l.saw}
}
