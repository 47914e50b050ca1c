package kafkago_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testLogger logs at warn level, or at TIDEMARK_TEST_LOG (debug, info) when
// set, to the test's output.
func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	switch os.Getenv("TIDEMARK_TEST_LOG") {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

func TestNewValidates(t *testing.T) {
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
	src, err := kafkago.New(brokers, "g", topics, kafkago.StartOffset(kafka.LastOffset), kafkago.Balancers(kafka.RangeGroupBalancer{}), kafkago.Logger(testLogger(t)))
	if err != nil {
		t.Fatalf("New with valid options: %v", err)
	}
	src.Close()
}

// cluster is an in-process kfake cluster with a franz-go client for
// producing (to the partition a record names) and admin requests.
type cluster struct {
	c   *kfake.Cluster
	cl  *kgo.Client
	adm *kadm.Client
}

func newCluster(t *testing.T, opts ...kfake.Opt) *cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		c.Close()
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() {
		cl.Close()
		c.Close()
	})
	return &cluster{c: c, cl: cl, adm: kadm.NewClient(cl)}
}

func (c *cluster) produce(t *testing.T, topic string, partitions int32, per int) {
	t.Helper()
	var recs []*kgo.Record
	for p := range partitions {
		for i := range per {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte(strconv.Itoa(i)),
				Headers: []kgo.RecordHeader{{Key: "i", Value: []byte(strconv.Itoa(i))}}})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func (c *cluster) atEnd(t *testing.T, group, topic string) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ends, err := c.adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatalf("end offsets: %v", err)
		}
		got, err := c.adm.FetchOffsets(ctx, group)
		if errors.Is(err, kerr.GroupIDNotFound) {
			return false
		}
		if err != nil {
			t.Fatalf("committed offsets: %v", err)
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			at, found := got.Lookup(topic, o.Partition)
			ok = ok && found && at.At == o.Offset
		})
		return ok
	}
}

func (c *cluster) members(t *testing.T, group string) []kadm.DescribedGroupMember {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := c.adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe group: %v", err)
	}
	return d[group].Members
}

// ledger counts handler calls per partition and offset.
type ledger struct {
	mu    sync.Mutex
	calls map[runner.TP]map[int64]int
	n     int
}

func newLedger() *ledger { return &ledger{calls: map[runner.TP]map[int64]int{}} }

func (l *ledger) handler(h func(runner.Record)) runner.Handler {
	return func(_ context.Context, rec runner.Record) error {
		l.mu.Lock()
		if l.calls[rec.TP()] == nil {
			l.calls[rec.TP()] = map[int64]int{}
		}
		l.calls[rec.TP()][rec.Offset]++
		l.n++
		l.mu.Unlock()
		if h != nil {
			h(rec)
		}
		return nil
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// exactlyOnce reports the first offset below per on any partition not
// handled exactly once.
func (l *ledger) exactlyOnce(topic string, partitions int32, per int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p := range partitions {
		tp := runner.TP{Topic: topic, Partition: p}
		for off := range int64(per) {
			if n := l.calls[tp][off]; n != 1 {
				return fmt.Errorf("%s@%d handled %d times", tp, off, n)
			}
		}
	}
	return nil
}

// spySink records what a source reports, for the tests that look at
// ownership.
type spySink struct {
	runner.Sink
	mu     sync.Mutex
	events []string // "assigned t/0 t/1", "revoked ...", "lost ..."
}

func (s *spySink) add(kind string, tps []runner.TP) {
	e := kind
	for _, tp := range tps {
		e += " " + tp.String()
	}
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *spySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	var tps []runner.TP
	for _, a := range parts {
		tps = append(tps, a.TP)
	}
	s.add("assigned", tps)
	return s.Sink.Assigned(ctx, parts)
}

func (s *spySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	s.add("revoked", tps)
	return s.Sink.Revoked(ctx, tps, deadline)
}

func (s *spySink) Lost(ctx context.Context, tps []runner.TP) error {
	s.add("lost", tps)
	return s.Sink.Lost(ctx, tps)
}

func (s *spySink) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// spied runs a Source with a spySink.
type spied struct {
	*kafkago.Source
	sink *spySink
}

func (s *spied) Run(ctx context.Context, sink runner.Sink) error {
	s.sink.Sink = sink
	return s.Source.Run(ctx, s.sink)
}

// member is a runner over a kafkago Source on the kfake cluster.
type member struct {
	src  *kafkago.Source
	spy  *spySink
	r    *runner.Runner
	done chan error
	once sync.Once
}

func start(t *testing.T, c *cluster, group, topic string, h runner.Handler, ropts ...runner.Option) *member {
	t.Helper()
	src, err := kafkago.New(c.c.ListenAddrs(), group, []string{topic},
		kafkago.SessionTimeout(2*time.Second), kafkago.RebalanceTimeout(3*time.Second),
		kafkago.HeartbeatInterval(100*time.Millisecond), kafkago.JoinGroupBackoff(100*time.Millisecond),
		kafkago.MaxWait(100*time.Millisecond), kafkago.Logger(testLogger(t)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sp := &spySink{}
	r, err := runner.New(&spied{Source: src, sink: sp}, append([]runner.Option{
		runner.Handle(topic, h), runner.Logger(testLogger(t)),
		runner.CommitInterval(20 * time.Millisecond), runner.DrainBudget(time.Second),
	}, ropts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	m := &member{src: src, spy: sp, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

func (m *member) stop(t *testing.T) {
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConsumeAll: one member handles every record exactly once, with its
// key, value and headers, commits the end offsets, and leaves the group on
// Shutdown.
func TestConsumeAll(t *testing.T) {
	const partitions, per = 3, 500
	c := newCluster(t, kfake.SeedTopics(partitions, "t"))
	c.produce(t, "t", partitions, per)
	l := newLedger()
	var bad []string
	var mu sync.Mutex
	m := start(t, c, "g", "t", l.handler(func(r runner.Record) {
		if h, _ := r.Header("i"); string(h) != string(r.Value) || string(r.Key) != "k"+strconv.Itoa(int(r.Offset)%7) {
			mu.Lock()
			bad = append(bad, r.String())
			mu.Unlock()
		}
	}))
	waitFor(t, 10*time.Second, "committed == end offsets", c.atEnd(t, "g", "t"))
	m.stop(t)
	if err := l.exactlyOnce("t", partitions, per); err != nil {
		t.Error(err)
	}
	if len(bad) > 0 {
		t.Errorf("records with the wrong key or headers: %v", bad)
	}
	if ms := c.members(t, "g"); len(ms) != 0 {
		t.Errorf("group still has %d members after Shutdown", len(ms))
	}
}

// TestEagerRebalance: when a second member joins, the first has every one
// of its partitions revoked (kafka-go is eager), drained and committed
// before the second starts: in partition order, no record is handled twice.
func TestEagerRebalance(t *testing.T) {
	const partitions, per = 4, 300
	c := newCluster(t, kfake.SeedTopics(partitions, "t"))
	c.produce(t, "t", partitions, per)
	l := newLedger()
	slow := l.handler(func(runner.Record) { time.Sleep(2 * time.Millisecond) })
	a := start(t, c, "g", "t", slow, runner.Order(runner.PartitionOrder), runner.Concurrency(4))
	waitFor(t, 10*time.Second, "the first member handles records", func() bool { return l.count() > 50 })
	b := start(t, c, "g", "t", slow, runner.Order(runner.PartitionOrder), runner.Concurrency(4))
	waitFor(t, 20*time.Second, "committed == end offsets", c.atEnd(t, "g", "t"))
	a.stop(t)
	b.stop(t)
	if err := l.exactlyOnce("t", partitions, per); err != nil {
		t.Error(err)
	}
	ev := a.spy.seen()
	if len(ev) < 3 || ev[1] != "revoked t/0 t/1 t/2 t/3" {
		t.Errorf("first member's reports %q: want an assignment of all four, then a revoke of all four", ev)
	}
	if bev := b.spy.seen(); len(bev) == 0 || bev[0] == "assigned t/0 t/1 t/2 t/3" {
		t.Errorf("second member's reports %q: want a share of the partitions", bev)
	}
}

// TestEvictedMemberLoses: a member removed from the group (LeaveGroup with
// its member id) while records keep coming finds out through its next
// commit, reports its partitions lost, has no later commit accepted for
// that generation, and rejoins.
func TestEvictedMemberLoses(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			c.cl.Produce(context.Background(), &kgo.Record{Topic: "t", Value: []byte(strconv.Itoa(i))}, nil)
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	l := newLedger()
	m := start(t, c, "g", "t", l.handler(nil))
	waitFor(t, 10*time.Second, "records handled", func() bool { return l.count() > 20 })
	ms := c.members(t, "g")
	if len(ms) != 1 {
		t.Fatalf("%d members, want 1", len(ms))
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = "g"
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = ms[0].MemberID
	req.Members = append(req.Members, lm)
	if _, err := req.RequestWith(context.Background(), c.cl); err != nil {
		t.Fatalf("evict: %v", err)
	}
	waitFor(t, 10*time.Second, "the loss reported and the member back", func() bool {
		ev := m.spy.seen()
		lost := -1
		for i, e := range ev {
			if e == "lost t/0" {
				lost = i
			}
		}
		return lost > 0 && len(ev) > lost+1 && ev[len(ev)-1] == "assigned t/0"
	})
	ev := m.spy.seen()
	if err := m.src.Commit(context.Background(), []runner.Offset{{TP: runner.TP{Topic: "t", Partition: 1}, Offset: 1}}); !errors.Is(err, kafkago.ErrNotOwned) {
		t.Errorf("Commit of a partition not owned returned %v, want ErrNotOwned", err)
	}
	t.Logf("reports: %q", ev)
}

// TestCommitErrors: Commit before Run commits nothing and names the
// partitions; Run twice, and Run or Commit after Close, are refused.
func TestCommitErrors(t *testing.T) {
	src, err := kafkago.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, kafkago.Logger(testLogger(t)))
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
	if err := src.Run(context.Background(), &spySink{}); !errors.Is(err, kafkago.ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
	if err := src.Run(context.Background(), &spySink{}); !errors.Is(err, kafkago.ErrAlreadyRun) {
		t.Errorf("second Run: %v, want ErrAlreadyRun", err)
	}
	if err := src.Commit(context.Background(), []runner.Offset{{TP: tp, Offset: 5}}); !errors.Is(err, kafkago.ErrClosed) {
		t.Errorf("Commit after Close: %v, want ErrClosed", err)
	}
}

// TestFatalGroupError: a session timeout the broker refuses stops the
// runner with a *GroupError instead of retrying forever.
func TestFatalGroupError(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(5*time.Second))
	src, err := kafkago.New(c.c.ListenAddrs(), "g", []string{"t"}, kafkago.SessionTimeout(time.Second),
		kafkago.HeartbeatInterval(100*time.Millisecond), kafkago.Logger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }), runner.Logger(testLogger(t)))
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
	c := newCluster(t, kfake.SeedTopics(1, "t", "dlq"))
	src, err := kafkago.New(c.c.ListenAddrs(), "g", []string{"t"}, kafkago.Logger(testLogger(t)))
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.c.ListenAddrs()...), kgo.ConsumeTopics("dlq"))
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
