//go:build integration && cluster

package testbed_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/testbed"
)

// The verbs of a cluster bed against the real thing: a three-node bed
// that scripts/testbed up --cluster 3 started (TIDEMARK_KAFKA_NODES=3 and
// the bed's ports in the environment, as for up). Run with
//
//	go test -count=1 -tags 'integration cluster' -run TestClusterVerbs ./internal/testbed/
//
// It kills, pauses and restarts the bed's brokers: run it alone.

// clusterBed opens the bed of the checkout and fails unless it is a cluster
// of three nodes that serves.
func clusterBed(t *testing.T) (*testbed.Bed, *bytes.Buffer, *testbed.State) {
	t.Helper()
	out := &bytes.Buffer{}
	b, err := testbed.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := b.Status(ctx)
	if err != nil || s.State == nil || s.State.Kafka == nil || len(s.State.Kafka.Nodes) != 3 || s.Code() != 0 {
		t.Fatalf("this test needs a three-node cluster bed serving (scripts/testbed up --cluster 3); the bed in %s says: %v\n%s",
			b.Dir(), err, strings.Join(s.Lines(), "\n"))
	}
	return b, out, s.State
}

func TestClusterVerbs(t *testing.T) {
	b, out, st := clusterBed(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(st.Brokers(), ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := fmt.Sprintf("tidemark-cluster-verbs-%d", time.Now().UnixNano())
	// No replication factor: the cluster's default, which must be 3 with
	// min.insync.replicas 2.
	if r, err := adm.CreateTopic(ctx, 3, -1, nil, topic); err != nil || r.Err != nil {
		t.Fatalf("create %s: %v %v", topic, err, r.Err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopic(context.Background(), topic) })
	if err := b.WaitInSync(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range td[topic].Partitions.Sorted() {
		if len(p.Replicas) != 3 || len(p.ISR) != 3 {
			t.Errorf("%s/%d: replicas %v, isr %v; want three of each", topic, p.Partition, p.Replicas, p.ISR)
		}
	}
	rc, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := rc.On(topic, nil); err != nil || configValue(v, "min.insync.replicas") != "2" {
		t.Errorf("%s: min.insync.replicas %q (%v), want 2", topic, configValue(v, "min.insync.replicas"), err)
	}
	// The internal topics too. Kafka creates them on first use: a
	// committed transaction (and its offsets commit) makes both.
	tcl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(st.Brokers(), ",")...),
		kgo.TransactionalID(topic+"-txn"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	err = tcl.BeginTransaction()
	if err == nil {
		err = tcl.ProduceSync(tctx, &kgo.Record{Value: []byte("txn")}).FirstErr()
	}
	if err == nil {
		err = tcl.EndTransaction(tctx, kgo.TryCommit)
	}
	tcancel()
	tcl.Close()
	if err != nil {
		t.Fatalf("a transaction, to create __transaction_state: %v", err)
	}
	offs := kadm.Offsets{}
	offs.AddOffset(topic, 0, 1, -1)
	if _, err := adm.CommitOffsets(ctx, topic+"-offsets", offs); err != nil {
		t.Fatalf("an offset commit, to create __consumer_offsets: %v", err)
	}
	for _, in := range []string{"__consumer_offsets", "__transaction_state"} {
		td, err := adm.ListTopicsWithInternal(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if len(td[in].Partitions) == 0 {
			t.Errorf("%s: no partitions (the topic does not exist)", in)
		}
		for _, p := range td[in].Partitions.Sorted() {
			if len(p.Replicas) != 3 {
				t.Errorf("%s/%d: replicas %v, want three", in, p.Partition, p.Replicas)
				break
			}
		}
		rc, err := adm.DescribeTopicConfigs(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if v, err := rc.On(in, nil); err != nil || configValue(v, "min.insync.replicas") != "2" {
			t.Errorf("%s: min.insync.replicas %q (%v), want 2", in, configValue(v, "min.insync.replicas"), err)
		}
	}

	// produce writes one record to partition p, with acks=all (the
	// client's default), through every node but skip: a client whose seed
	// is a paused broker waits out a request timeout on it (the dial
	// succeeds, nothing answers) before it tries another.
	// 90 s: with the active controller paused, a broker's first
	// idempotent write waits for a producer id block, which it asks the
	// controller for over a channel that still points at the paused node
	// until that request times out (30 s): the write failed within 30 s
	// with COORDINATOR_LOAD_IN_PROGRESS once (node 2 paused; leadership
	// moved after 26.8 s).
	produce := func(p, skip int32) error {
		pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		r := &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}
		var seeds []string
		for _, n := range st.Kafka.Nodes {
			if n.ID != skip {
				seeds = append(seeds, n.Addr())
			}
		}
		pc, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			return err
		}
		defer pc.Close()
		return pc.ProduceSync(pctx, r).FirstErr()
	}
	// moved waits until what(…) answers something other than from.
	moved := func(what string, from int32, get func(context.Context) (int32, error)) int32 {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			id, err := get(qctx)
			cancel()
			if err == nil && id != from {
				return id
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still %d (or unknown: %v) a minute after node %d went away", what, id, err, from)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	node := func(id int32) testbed.Service { return testbed.Service{Kind: testbed.Kafka, Node: id} }
	bringBack := func(id int32) {
		t.Helper()
		t0 := time.Now()
		out.Reset()
		if err := b.Start(ctx, node(id)); err != nil {
			t.Fatalf("start node %d: %v\n%s", id, err, out)
		}
		if err := b.WaitInSync(ctx, 2*time.Minute); err != nil {
			t.Fatalf("after node %d came back: %v", id, err)
		}
		t.Logf("node %d back and every partition in sync in %s", id, time.Since(t0).Round(10*time.Millisecond))
	}

	// kill -9 the leader of partition 0: another replica leads, acks=all
	// writes go on with two in sync.
	leader0 := func(c context.Context) (int32, error) { return b.Leader(c, topic, 0) }
	l, err := leader0(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := b.Stop(ctx, node(l), testbed.Crash); err != nil {
		t.Fatal(err)
	}
	nl := moved("the leader of partition 0", l, leader0)
	t.Logf("killed node %d, the leader of %s/0: node %d leads after %s", l, topic, nl, time.Since(t0).Round(10*time.Millisecond))
	if err := produce(0, l); err != nil {
		t.Errorf("acks=all write to partition 0 with node %d down: %v", l, err)
	}
	bringBack(l)

	// kill -9 the group's coordinator: another node coordinates.
	group := topic + "-group"
	coord := func(c context.Context) (int32, error) { return b.Coordinator(c, group) }
	c, err := coord(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := b.Stop(ctx, node(c), testbed.Crash); err != nil {
		t.Fatal(err)
	}
	nc := moved("the coordinator of "+group, c, coord)
	t.Logf("killed node %d, the coordinator of %s: node %d after %s", c, group, nc, time.Since(t0).Round(10*time.Millisecond))
	bringBack(c)

	// SIGSTOP the leader of partition 1 past the broker session timeout
	// (9 s): the controller fences it and another replica leads.
	leader1 := func(c context.Context) (int32, error) { return b.Leader(c, topic, 1) }
	p, err := leader1(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := b.Pause(ctx, node(p)); err != nil {
		t.Fatal(err)
	}
	np := moved("the leader of partition 1", p, leader1)
	t.Logf("paused node %d, the leader of %s/1: node %d leads after %s", p, topic, np, time.Since(t0).Round(10*time.Millisecond))
	t0 = time.Now()
	if err := produce(1, p); err != nil {
		t.Errorf("acks=all write to partition 1 with node %d paused: %v", p, err)
	}
	t.Logf("acks=all write to partition 1 with node %d paused: %s", p, time.Since(t0).Round(10*time.Millisecond))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s, _ := b.Status(sctx)
	cancel()
	if !strings.Contains(strings.Join(s.Lines(), "\n"), fmt.Sprintf("PAUSED (SIGSTOP): scripts/testbed resume kafka-%d", p)) {
		t.Errorf("status does not say node %d is paused: %q", p, s.Lines())
	}
	if err := b.Resume(ctx, node(p)); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitInSync(ctx, 2*time.Minute); err != nil {
		t.Fatalf("after node %d was continued: %v", p, err)
	}

	// A graceful restart of each node in turn, in sync between them.
	for _, id := range []int32{1, 2, 3} {
		t0 := time.Now()
		out.Reset()
		if err := b.Restart(ctx, node(id), testbed.Graceful); err != nil {
			t.Fatalf("restart node %d: %v\n%s", id, err, out)
		}
		if err := b.WaitInSync(ctx, 2*time.Minute); err != nil {
			t.Fatalf("after restarting node %d: %v", id, err)
		}
		t.Logf("restarted node %d, in sync in %s", id, time.Since(t0).Round(10*time.Millisecond))
	}
	for p := range int32(3) {
		if err := produce(p, -1); err != nil {
			t.Errorf("acks=all write to partition %d after the rolling restart: %v", p, err)
		}
	}
}

func configValue(rc kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key {
			return c.MaybeValue()
		}
	}
	return ""
}
