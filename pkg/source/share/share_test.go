package share_test

// Fast tests over kfake. They check the source's own logic (options, the
// gating, settlement, shutdown); the broker's behaviour is proven against
// the real Kafka 4.4 broker in integration/share_test.go.

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		option  string
		brokers []string
		group   string
		topics  []string
		opts    []share.Option
	}{
		{"brokers", nil, "g", []string{"t"}, nil},
		{"group", []string{"x:1"}, "", []string{"t"}, nil},
		{"topics", []string{"x:1"}, "g", nil, nil},
		{"topics", []string{"x:1"}, "g", []string{"t", "t"}, nil},
		{"Sessions", []string{"x:1"}, "g", []string{"t"}, []share.Option{share.Sessions(0)}},
		{"MaxPollRecords", []string{"x:1"}, "g", []string{"t"}, []share.Option{share.MaxPollRecords(0)}},
		{"CloseTimeout", []string{"x:1"}, "g", []string{"t"}, []share.Option{share.CloseTimeout(0)}},
		{"GroupConfig", []string{"x:1"}, "g", []string{"t"}, []share.Option{share.GroupConfig("", "v")}},
		{"ClientOptions", []string{"x:1"}, "g", []string{"t"}, []share.Option{share.ClientOptions(kgo.MaxConcurrentFetches(2))}},
	} {
		_, err := share.New(tc.brokers, tc.group, tc.topics, tc.opts...)
		var ce *share.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: New returned %v, want a *ConfigError for %s", tc.option, err, tc.option)
		}
	}
}

// fake is a kfake cluster with one topic holding n records (values 0..n-1).
func fake(t *testing.T, topic string, partitions int32, n int, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range n {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// lag returns group's share lag on topic/0 (-1: no state yet).
func lag(t *testing.T, c *kfake.Cluster, group, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ds, err := kadm.NewClient(cl).DescribeShareGroupOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := ds[group].Offsets.Lookup(topic, 0)
	if !ok || o.Err != nil {
		return -1
	}
	return o.Lag
}

// nextMember runs a one-session member of group on topic until it has
// handled want distinct records, stops it and returns the delivery count
// each offset last came with.
func nextMember(t *testing.T, c *kfake.Cluster, group, topic string, want int) map[int64]int32 {
	t.Helper()
	src, err := share.New(c.ListenAddrs(), group, []string{topic}, share.Sessions(1))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	counts := map[int64]int32{}
	stop := run(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
		mu.Lock()
		counts[rec.Offset] = rec.DeliveryCount
		mu.Unlock()
		return nil
	}), runner.Failure(runner.Skip(1)))
	waitFor(t, "the next member handled its records", func() bool { mu.Lock(); defer mu.Unlock(); return len(counts) == want })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(counts)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run starts a runner over src and returns a func that shuts it down and
// returns Run's error.
func run(t *testing.T, src *share.Source, opts ...runner.Option) func(budget time.Duration) error {
	t.Helper()
	r, err := runner.New(src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	var once sync.Once
	var runErr error
	stop := func(budget time.Duration) error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			_ = r.Shutdown(ctx)
			runErr = <-errc
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop(5 * time.Second) })
	return stop
}

// TestGatedUntilSettled: while one record of a session's poll runs, that
// record is not accepted (the lag stays 1) although the others are
// handled; once it returns, everything is accepted, each record once.
func TestGatedUntilSettled(t *testing.T) {
	t.Parallel()
	const topic, group, n = "t", "g", 40
	c := fake(t, topic, 1, n)
	c.SetGroupConfigs(group, map[string]string{"share.auto.offset.reset": "earliest"})
	src, err := share.New(c.ListenAddrs(), group, []string{topic}, share.Sessions(2), share.MaxPollRecords(8))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[int64]int{}
	release := make(chan struct{})
	stop := run(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		mu.Lock()
		calls[rec.Offset]++
		mu.Unlock()
		if rec.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}), runner.Failure(runner.Skip(1)))
	handled := func() int { mu.Lock(); defer mu.Unlock(); return len(calls) }
	waitFor(t, "every record reached a handler", func() bool { return handled() == n })
	waitFor(t, "every record but 0 acknowledged", func() bool { return lag(t, c, group, topic) == 1 })
	close(release)
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, group, topic) == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for off, k := range calls {
		if k != 1 {
			t.Errorf("offset %d handled %d times, want 1", off, k)
		}
	}
}

// TestCloseReleases: records still held when the runner stops are
// released, so the next member gets them (delivery count 2), not lost to an
// accept.
func TestCloseReleases(t *testing.T) {
	t.Parallel()
	const topic, group, n = "t", "g", 10
	c := fake(t, topic, 1, n)
	c.SetGroupConfigs(group, map[string]string{"share.auto.offset.reset": "earliest"})
	src, err := share.New(c.ListenAddrs(), group, []string{topic}, share.Sessions(1), share.MaxPollRecords(n))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, n)
	stop := run(t, src, runner.Handle(topic, func(ctx context.Context, _ runner.Record) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}), runner.Failure(runner.Skip(1)), runner.Concurrency(2))
	<-started
	<-started
	var de *runner.DrainError
	if err := stop(300 * time.Millisecond); !errors.As(err, &de) {
		t.Fatalf("Run: %v, want a *DrainError", err)
	}

	counts := nextMember(t, c, group, topic, n)
	for off, dc := range counts {
		if dc != 2 {
			t.Errorf("offset %d: delivery count %d on the second member, want 2 (released by the first)", off, dc)
		}
	}
}
