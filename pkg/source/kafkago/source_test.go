package kafkago_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNewArgumentMessages: New's messages for bad arguments and balancer
// lists, word for word, and which of two bad arguments it names first.
func TestNewArgumentMessages(t *testing.T) {
	t.Parallel()
	cases := []struct {
		brokers []string
		group   string
		topics  []string
		opts    []kafkago.Option
		want    string
	}{
		{nil, "", nil, nil, "kafkago: option brokers: no seed broker"},
		{[]string{"x:1"}, "", nil, nil, "kafkago: option group: empty group"},
		{[]string{"x:1"}, "g", nil, nil, "kafkago: option topics: no topic"},
		{[]string{"x:1", ""}, "g", []string{""}, nil, "kafkago: option brokers: broker 1 is empty"},
		{[]string{"x:1"}, "g", []string{"t", ""}, nil, "kafkago: option topics: topic 1 is empty"},
		{[]string{"x:1"}, "g", []string{"t", "u", "t", ""}, nil, `kafkago: option topics: topic "t" given twice`},
		{[]string{"x:1"}, "g", []string{"t"}, []kafkago.Option{kafkago.Balancers()}, "kafkago: option Balancers: no balancer given"},
		{[]string{"x:1"}, "g", []string{"t"}, []kafkago.Option{kafkago.Balancers(kafka.RangeGroupBalancer{}, nil)}, "kafkago: option Balancers: balancer 1 is nil"},
	}
	for _, tc := range cases {
		src, err := kafkago.New(tc.brokers, tc.group, tc.topics, append([]kafkago.Option{kafkago.Logger(kafkatest.Logger(t))}, tc.opts...)...)
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

func TestNewValidates(t *testing.T) {
	t.Parallel()
	brokers, topics := []string{"127.0.0.1:9092"}, []string{"t"}
	tests := []struct {
		name    string
		brokers []string
		group   string
		topics  []string
		opts    []kafkago.Option
		option  string
	}{
		{"no broker", nil, "g", topics, nil, "brokers"},
		{"empty broker", []string{""}, "g", topics, nil, "brokers"},
		{"no group", brokers, "", topics, nil, "group"},
		{"no topic", brokers, "g", nil, nil, "topics"},
		{"topic twice", brokers, "g", []string{"t", "t"}, nil, "topics"},
		{"session timeout", brokers, "g", topics, []kafkago.Option{kafkago.SessionTimeout(0)}, "SessionTimeout"},
		{"rebalance timeout", brokers, "g", topics, []kafkago.Option{kafkago.RebalanceTimeout(-time.Second)}, "RebalanceTimeout"},
		{"heartbeat above the session timeout", brokers, "g", topics, []kafkago.Option{kafkago.SessionTimeout(time.Second), kafkago.HeartbeatInterval(time.Second)}, "HeartbeatInterval"},
		{"heartbeat above the rebalance timeout", brokers, "g", topics, []kafkago.Option{kafkago.RebalanceTimeout(2 * time.Second), kafkago.HeartbeatInterval(3 * time.Second)}, "HeartbeatInterval"},
		{"join backoff", brokers, "g", topics, []kafkago.Option{kafkago.JoinGroupBackoff(0)}, "JoinGroupBackoff"},
		{"start offset", brokers, "g", topics, []kafkago.Option{kafkago.StartOffset(5)}, "StartOffset"},
		{"min bytes", brokers, "g", topics, []kafkago.Option{kafkago.MinBytes(0)}, "MinBytes"},
		{"max bytes below min", brokers, "g", topics, []kafkago.Option{kafkago.MinBytes(100), kafkago.MaxBytes(10)}, "MaxBytes"},
		{"max wait", brokers, "g", topics, []kafkago.Option{kafkago.MaxWait(0)}, "MaxWait"},
		{"nil dialer", brokers, "g", topics, []kafkago.Option{kafkago.Dialer(nil)}, "Dialer"},
		{"nil logger", brokers, "g", topics, []kafkago.Option{kafkago.Logger(nil)}, "Logger"},
		{"no balancer", brokers, "g", topics, []kafkago.Option{kafkago.Balancers()}, "Balancers"},
		{"nil balancer", brokers, "g", topics, []kafkago.Option{kafkago.Balancers(nil)}, "Balancers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := kafkago.New(tc.brokers, tc.group, tc.topics, tc.opts...)
			var ce *kafkago.ConfigError
			if !errors.As(err, &ce) {
				if src != nil {
					src.Close()
				}
				t.Fatalf("New returned %v, want a *ConfigError", err)
			}
			if ce.Option != tc.option {
				t.Errorf("ConfigError names %q, want %q (%v)", ce.Option, tc.option, err)
			}
		})
	}
	src, err := kafkago.New(brokers, "g", topics, kafkago.StartOffset(kafka.LastOffset), kafkago.Balancers(kafka.RangeGroupBalancer{}), kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatalf("New with valid options: %v", err)
	}
	src.Close()
}

// produce writes per records to each of partitions of topic, record i
// keyed k<i%7> (see kafkatest.Spread).
func produce(c *kafkatest.Cluster, topic string, partitions int32, per int) {
	c.Produce(kafkatest.Spread(topic, partitions, per, func(_ int32, i int) string { return "k" + strconv.Itoa(i%7) })...)
}

// member is a runner over a spied kafkago Source on the kfake cluster.
type member struct {
	*kafkatest.Member
	src *kafkago.Source
}

func start(t *testing.T, c *kafkatest.Cluster, group, topic string, h runner.Handler, ropts ...runner.Option) *member {
	t.Helper()
	return startWith(t, c, group, topic, h, nil, ropts...)
}

// startWith is start with kafka-go options after start's own.
func startWith(t *testing.T, c *kafkatest.Cluster, group, topic string, h runner.Handler, sopts []kafkago.Option, ropts ...runner.Option) *member {
	t.Helper()
	src, err := kafkago.New(c.Brokers(), group, []string{topic}, append([]kafkago.Option{
		kafkago.SessionTimeout(2 * time.Second), kafkago.RebalanceTimeout(3 * time.Second),
		kafkago.HeartbeatInterval(100 * time.Millisecond), kafkago.JoinGroupBackoff(100 * time.Millisecond),
		kafkago.MaxWait(100 * time.Millisecond), kafkago.Logger(kafkatest.Logger(t))}, sopts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &member{Member: kafkatest.Start(t, "", src, 10*time.Second, append([]runner.Option{
		runner.Handle(topic, h), runner.Logger(kafkatest.Logger(t)),
		runner.CommitInterval(20 * time.Millisecond), runner.DrainBudget(time.Second),
	}, ropts...)...), src: src}
}

// TestConsumeAll: one member handles every record exactly once, with its
// key, value and headers, commits the end offsets, and leaves the group on
// Shutdown.
func TestConsumeAll(t *testing.T) {
	t.Parallel()
	const partitions, per = 3, 500
	c := kafkatest.NewFake(t, kfake.SeedTopics(partitions, "t"))
	produce(c, "t", partitions, per)
	l := kafkatest.NewLedger()
	var bad []string
	var mu sync.Mutex
	m := start(t, c, "g", "t", l.Handler("", func(_ context.Context, r runner.Record) error {
		if h, _ := r.Header("i"); string(h) != string(r.Value) || string(r.Key) != "k"+strconv.Itoa(int(r.Offset)%7) {
			mu.Lock()
			bad = append(bad, r.String())
			mu.Unlock()
		}
		return nil
	}))
	kafkatest.WaitFor(t, 10*time.Second, "committed == end offsets", c.AtEnd("g", "t"))
	m.Stop(t)
	if err := l.ExactlyOnce("t", kafkatest.Uniform(partitions, per)); err != nil {
		t.Error(err)
	}
	if len(bad) > 0 {
		t.Errorf("records with the wrong key or headers: %v", bad)
	}
	if ms := c.Members("g"); len(ms) != 0 {
		t.Errorf("group still has %d members after Shutdown", len(ms))
	}
}

// TestEagerRebalance: when a second member joins, the first has every one
// of its partitions revoked (kafka-go is eager), drained and committed
// before the second starts: in partition order, no record is handled twice.
func TestEagerRebalance(t *testing.T) {
	t.Parallel()
	const partitions, per = 4, 300
	c := kafkatest.NewFake(t, kfake.SeedTopics(partitions, "t"))
	produce(c, "t", partitions, per)
	l := kafkatest.NewLedger()
	slow := l.Handler("", func(context.Context, runner.Record) error { time.Sleep(2 * time.Millisecond); return nil })
	a := start(t, c, "g", "t", slow, runner.Order(runner.PartitionOrder), runner.Concurrency(4))
	kafkatest.WaitFor(t, 10*time.Second, "the first member handles records", func() bool { return l.Count() > 50 })
	b := start(t, c, "g", "t", slow, runner.Order(runner.PartitionOrder), runner.Concurrency(4))
	kafkatest.WaitFor(t, 20*time.Second, "committed == end offsets", c.AtEnd("g", "t"))
	a.Stop(t)
	b.Stop(t)
	if err := l.ExactlyOnce("t", kafkatest.Uniform(partitions, per)); err != nil {
		t.Error(err)
	}
	ev := a.Spy.Events()
	if len(ev) < 3 || ev[1] != "revoked t/0 t/1 t/2 t/3" {
		t.Errorf("first member's reports %q: want an assignment of all four, then a revoke of all four", ev)
	}
	if bev := b.Spy.Events(); len(bev) == 0 || bev[0] == "assigned t/0 t/1 t/2 t/3" {
		t.Errorf("second member's reports %q: want a share of the partitions", bev)
	}
}

// TestEvictedMemberLoses: a member removed from the group (LeaveGroup with
// its member id) while records keep coming finds out through its next
// commit, reports its partitions lost, has no later commit accepted for
// that generation, and rejoins.
func TestEvictedMemberLoses(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			c.Client().Produce(context.Background(), &kgo.Record{Topic: "t", Value: []byte(strconv.Itoa(i))}, nil)
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	l := kafkatest.NewLedger()
	// Heartbeats seconds apart, commits every 20 ms: the member learns of
	// its eviction from a commit, which says the member is gone. From a
	// heartbeat it learns only that its generation ended, as from a
	// rebalance (kafka-go does not say which): it reports a revoke, and
	// when its revoke has nothing left to commit, no loss at all (CI saw
	// that, the records then coming slower than the commits).
	m := startWith(t, c, "g", "t", l.Handler("", nil),
		[]kafkago.Option{kafkago.SessionTimeout(20 * time.Second), kafkago.RebalanceTimeout(20 * time.Second),
			kafkago.HeartbeatInterval(5 * time.Second)})
	kafkatest.WaitFor(t, 10*time.Second, "records handled", func() bool { return l.Count() > 20 })
	ms := c.Members("g")
	if len(ms) != 1 {
		t.Fatalf("%d members, want 1", len(ms))
	}
	c.Evict("g", ms[0].MemberID)
	// kafka-go learns of the eviction at a heartbeat and rejoins through
	// a fresh JoinGroup: seconds, more on a loaded machine.
	kafkatest.WaitFor(t, time.Minute, "the loss reported and the member back", func() bool {
		ev := m.Spy.Events()
		lost := -1
		for i, e := range ev {
			if e == "lost t/0" {
				lost = i
			}
		}
		return lost > 0 && len(ev) > lost+1 && ev[len(ev)-1] == "assigned t/0"
	})
	ev := m.Spy.Events()
	if err := m.src.Commit(context.Background(), []runner.Offset{{TP: runner.TP{Topic: "t", Partition: 1}, Offset: 1}}); !errors.Is(err, kafkago.ErrNotOwned) {
		t.Errorf("Commit of a partition not owned returned %v, want ErrNotOwned", err)
	}
	t.Logf("reports: %q", ev)
}

// TestCommitErrors: Commit before Run commits nothing and names the
// partitions; Run twice, and Run or Commit after Close, are refused.
func TestCommitErrors(t *testing.T) {
	t.Parallel()
	src, err := kafkago.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	tp := runner.TP{Topic: "t", Partition: 0}
	err = src.Commit(context.Background(), []runner.Offset{{TP: tp, Offset: 5}})
	var ce *kafkago.CommitError
	if !errors.As(err, &ce) || !errors.Is(err, kafkago.ErrNotOwned) || len(ce.NotOwned) != 1 || ce.NotOwned[0] != tp {
		t.Errorf("Commit before Run: %v, want a *CommitError naming %s not owned", err, tp)
	}
	if err := src.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := src.Run(context.Background(), struct{ runner.Sink }{}); !errors.Is(err, kafkago.ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
	if err := src.Run(context.Background(), struct{ runner.Sink }{}); !errors.Is(err, kafkago.ErrAlreadyRun) {
		t.Errorf("second Run: %v, want ErrAlreadyRun", err)
	}
	if err := src.Commit(context.Background(), []runner.Offset{{TP: tp, Offset: 5}}); !errors.Is(err, kafkago.ErrClosed) {
		t.Errorf("Commit after Close: %v, want ErrClosed", err)
	}
}

// TestFatalGroupError: a session timeout the broker refuses stops the
// runner with a *GroupError instead of retrying forever.
func TestFatalGroupError(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(5*time.Second))
	src, err := kafkago.New(c.Brokers(), "g", []string{"t"}, kafkago.SessionTimeout(time.Second),
		kafkago.HeartbeatInterval(100*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }), runner.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var ge *kafkago.GroupError
	if !errors.As(err, &ge) || !errors.Is(err, kafka.InvalidSessionTimeout) {
		t.Fatalf("Run returned %v, want a *GroupError wrapping kafka.InvalidSessionTimeout", err)
	}
}

// TestWriteDeadLetter: a dead letter keeps the key, value and headers.
func TestWriteDeadLetter(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t", "dlq"))
	src, err := kafkago.New(c.Brokers(), "g", []string{"t"}, kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := runner.Record{Topic: "t", Partition: 0, Offset: 7, Key: []byte("key"), Value: []byte("value"),
		Headers: []runner.Header{{Key: "h", Value: []byte("v")}}}
	if err := src.WriteDeadLetter(ctx, "dlq", rec); err != nil {
		t.Fatalf("WriteDeadLetter: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics("dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fs := cl.PollFetches(ctx)
	if err := fs.Err(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	recs := fs.Records()
	if len(recs) != 1 || string(recs[0].Key) != "key" || string(recs[0].Value) != "value" ||
		len(recs[0].Headers) != 1 || recs[0].Headers[0].Key != "h" || string(recs[0].Headers[0].Value) != "v" {
		t.Fatalf("dead letters %v, want the record with its key, value and header", recs)
	}
}
