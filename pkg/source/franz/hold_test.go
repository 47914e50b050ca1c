package franz_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// gateSink is a Sink whose Fetched reports each hand-over on entered and
// returns only once it is let go (a send on release, or stop closed), as a
// runner does while it acts on records (and pauses partitions before it
// answers).
type gateSink struct {
	chanSink
	entered chan []runner.Batch
	release chan struct{}
	stop    chan struct{}
}

func newGateSink() *gateSink {
	return &gateSink{entered: make(chan []runner.Batch, 10), release: make(chan struct{}), stop: make(chan struct{})}
}

func (s *gateSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	cp := make([]runner.Batch, len(bs))
	for i, b := range bs {
		b.Records = slices.Clone(b.Records)
		cp[i] = b
	}
	s.entered <- cp
	select {
	case <-s.release:
	case <-s.stop:
	}
	return 10, nil
}

func heldBatch(tp runner.TP, n int) runner.Batch {
	b := runner.Batch{TP: tp, Position: int64(n), HighWatermark: int64(n)}
	for i := range n {
		b.Records = append(b.Records, runner.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: int64(i), Value: []byte("v")})
	}
	return b
}

func tpsOf(bs []runner.Batch) []runner.TP {
	var tps []runner.TP
	for _, b := range bs {
		tps = append(tps, b.TP)
	}
	return tps
}

// TestHandOverHoldsNoLock: while the source waits in Sink.Fetched, what the
// runner and the client's callbacks call meanwhile returns: Pause and
// Resume (the runner calls them before it answers Fetched), and a revoke's
// drop of a partition not in the hand-over. Before, take returned with the
// held records' lock held and Run kept it across Fetched, so a revoke of
// any partition waited for the runner to take records of another.
func TestHandOverHoldsNoLock(t *testing.T) {
	t.Parallel()
	src := benchSourceT(t)
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	src.Hold([]runner.Batch{heldBatch(p0, 3), heldBatch(p1, 3)})
	sink := newGateSink()
	handed := make(chan struct{})
	go func() {
		defer close(handed)
		if _, ok, err := src.HandOver(context.Background(), sink, 3); !ok || err != nil {
			t.Errorf("HandOver: handed %v, %v; want the records of %s", ok, err, p0)
		}
	}()
	released := false
	release := func() {
		if !released {
			released = true
			close(sink.stop)
			<-handed
		}
	}
	defer release()
	if got := tpsOf(<-sink.entered); !slices.Equal(got, []runner.TP{p0}) {
		t.Fatalf("hand-over of %v, want only %s (budget 3)", got, p0)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Pause([]runner.TP{p1})
		src.Resume([]runner.TP{p1})
		_ = src.ParkedBytes()
		src.DropHeld([]runner.TP{p1})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		release()
		<-done
		t.Fatalf("Pause, Resume, ParkedBytes and a drop of %s did not return in 10s while Sink.Fetched handed over %s: a lock is held across Fetched", p1, p0)
	}
	release()
	if _, ok, _ := src.HandOver(context.Background(), &chanSink{batches: make(chan runner.Batch, 10)}, 10); ok {
		t.Fatalf("records of dropped %s handed over", p1)
	}
}

// TestDropWaitsForHandOver: a drop of a partition whose records are in the
// hand-over the source waits in returns only once Sink.Fetched returned, so
// the runner hears of the end of an assignment after every hand-over of
// its records; and none of the records the drop found held reaches the
// runner afterwards (invariant: no record of an ended assignment reaches
// the runner after it heard of the end).
func TestDropWaitsForHandOver(t *testing.T) {
	t.Parallel()
	src := benchSourceT(t)
	p0, p1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	synctest.Test(t, func(t *testing.T) {
		src.Hold([]runner.Batch{heldBatch(p0, 3), heldBatch(p1, 3)})
		sink := newGateSink()
		defer close(sink.stop) // lets the hand-overs end if the test fails
		go func() {
			for {
				if _, ok, err := src.HandOver(context.Background(), sink, 2); !ok || err != nil {
					return
				}
			}
		}()
		first := <-sink.entered
		if got := tpsOf(first); !slices.Equal(got, []runner.TP{p0}) || len(first[0].Records) != 2 {
			t.Fatalf("first hand-over %v, want 2 records of %s", first, p0)
		}
		dropped := make(chan struct{})
		go func() {
			src.DropHeld([]runner.TP{p0})
			close(dropped)
		}()
		synctest.Wait()
		select {
		case <-dropped:
			t.Fatalf("the drop of %s returned while a hand-over of its records was in Sink.Fetched", p0)
		default:
		}
		sink.release <- struct{}{} // the first hand-over returns
		synctest.Wait()
		select {
		case <-dropped:
		default:
			t.Fatalf("the drop of %s did not return once the hand-over of its records had", p0)
		}
		// What follows is p1's records only: p0's third record was
		// dropped.
		for want := 3; want > 0; {
			bs := <-sink.entered
			for _, b := range bs {
				if b.TP != p1 {
					t.Fatalf("hand-over after the drop has %s: %v", b.TP, b)
				}
				want -= len(b.Records)
			}
			sink.release <- struct{}{}
		}
		synctest.Wait()
	})
}
