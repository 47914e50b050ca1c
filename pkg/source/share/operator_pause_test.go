package share_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// TestOperatorPauseOfOnePartition: docs/operations.md says an operator's
// pause "stops fetching from the partition"; the page offers it per
// partition. Over the share source, a pause of partition 0 stops the
// member's every session (a session does not poll while any partition is
// paused): partition 1's records are not consumed either.
//
// Changed after the fix: the runner now refuses an operator's pause over a
// share source (runner.ErrPauseShared) rather than stop every partition,
// so the test asserts the refusal, and that partition 1 is still consumed.
func TestOperatorPauseOfOnePartition(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// From the start: with the default (latest) a share partition that
	// the first fetch initializes after the records below were produced
	// (on a loaded machine) would never deliver them.
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	produce := func(p int32) {
		t.Helper()
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1))
	if err != nil {
		t.Fatal(err)
	}
	var handled [2]atomic.Int64
	r, err := runner.New(src, runner.Handle("t", func(_ context.Context, rec runner.Record) error {
		handled[rec.Partition].Add(1)
		return nil
	}), runner.Failure(runner.Skip(1)))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-errc
	})
	produce(0)
	produce(1)
	waitFor(t, "one record of each partition handled", func() bool { return handled[0].Load() == 1 && handled[1].Load() == 1 })
	if err := r.PausePartitions(context.Background(), runner.TP{Topic: "t", Partition: 0}); !errors.Is(err, runner.ErrPauseShared) {
		t.Fatalf("PausePartitions over a share source: %v, want runner.ErrPauseShared", err)
	}
	if err := r.PauseTopics(context.Background(), "t"); !errors.Is(err, runner.ErrPauseShared) {
		t.Fatalf("PauseTopics over a share source: %v, want runner.ErrPauseShared", err)
	}
	produce(1)
	deadline := time.Now().Add(10 * time.Second)
	for handled[1].Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("partition 1's record not handled 10s after the operator paused partition 0 alone (handled %d, %d)", handled[0].Load(), handled[1].Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
