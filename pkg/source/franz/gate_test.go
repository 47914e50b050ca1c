package franz_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRebalanceWaitsForAllowRebalance pins the franz-go behaviour the
// source's hold relies on (hold.polled sets fetch offsets with SetOffsets
// after a poll, and the group callbacks drop a partition's refetch): with
// BlockRebalanceOnPoll and an OnPartitionsAssigned callback registered, no
// group callback runs between a poll that returned records and
// AllowRebalance. Here a second member joins while the first holds a
// poll: the first's revoke waits until it allows the rebalance. If a
// franz-go upgrade broke this, polled's SetOffsets could race a revoke and
// set a position for a partition already given away.
func TestRebalanceWaitsForAllowRebalance(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for p := range int32(2) {
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var callbacks, inPoll atomic.Int32
	var early atomic.Bool
	gate := func(context.Context, *kgo.Client, map[string][]int32) {
		callbacks.Add(1)
		if inPoll.Load() == 1 {
			early.Store(true)
		}
	}
	member := func(cb bool) *kgo.Client {
		opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
			kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {})}
		if cb {
			opts = append(opts, kgo.OnPartitionsRevoked(gate), kgo.OnPartitionsLost(gate))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	first := member(true)
	defer first.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := 0
	for got < 2 {
		fs := first.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("the first member polled %d of 2 records in 20s", got)
		}
		got += fs.NumRecords()
		first.AllowRebalance()
	}
	// Poll and hold: a poll that returns nothing holds as one that does.
	// A second member then joins; the first must give up a partition.
	pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	first.PollFetches(pctx)
	pcancel()
	inPoll.Store(1)
	second := member(false)
	defer second.Close()
	go func() {
		for ctx.Err() == nil {
			second.PollFetches(ctx)
			second.AllowRebalance()
		}
	}()
	time.Sleep(2 * time.Second)
	if callbacks.Load() != 0 || early.Load() {
		t.Fatalf("a group callback ran while the first member held its poll (before AllowRebalance): franz-go no longer gates callbacks on polls, and the source's hold.polled can race a revoke")
	}
	inPoll.Store(0)
	first.AllowRebalance()
	for callbacks.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the first member's revoke never ran after AllowRebalance: the second member's join did not rebalance, the test proved nothing")
		}
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		first.PollFetches(pctx)
		pcancel()
		first.AllowRebalance()
	}
	cancel()
}
