package runner_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// settleSource is a Settler: it reports its partitions once, hands over
// the batches given to it in order, and records every settlement.
type settleSource struct {
	batches []runner.Batch
	fed     chan struct{} // closed once every batch was handed over

	mu       sync.Mutex
	settled  map[int64][]runner.Settlement
	commits  int
	changed  chan struct{} // receives after every Settle (capacity 1)
	closedCh chan struct{}
	once     sync.Once
}

func newSettleSource(batches ...runner.Batch) *settleSource {
	return &settleSource{batches: batches, fed: make(chan struct{}), settled: map[int64][]runner.Settlement{},
		changed: make(chan struct{}, 1), closedCh: make(chan struct{})}
}

func (s *settleSource) Run(ctx context.Context, sink runner.Sink) error {
	seen := map[runner.TP]bool{}
	for _, b := range s.batches {
		if !seen[b.TP] {
			seen[b.TP] = true
			if err := sink.Assigned(ctx, []runner.Assignment{{TP: b.TP, Start: -1, Generation: runner.NoGeneration}}); err != nil {
				return err
			}
		}
		if _, err := sink.Fetched(ctx, []runner.Batch{b}); err != nil {
			return err
		}
	}
	close(s.fed)
	select {
	case <-ctx.Done():
	case <-s.closedCh:
	}
	return nil
}

func (s *settleSource) Pause([]runner.TP)  {}
func (s *settleSource) Resume([]runner.TP) {}
func (s *settleSource) Commit(context.Context, []runner.Offset) error {
	s.mu.Lock()
	s.commits++
	s.mu.Unlock()
	return errors.New("settleSource: nothing to commit")
}
func (s *settleSource) Close() error { s.once.Do(func() { close(s.closedCh) }); return nil }

func (s *settleSource) Settle(_ runner.TP, offset int64, st runner.Settlement) {
	s.mu.Lock()
	s.settled[offset] = append(s.settled[offset], st)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// waitSettled waits until n offsets are settled, or fails the test.
func (s *settleSource) waitSettled(t *testing.T, n int) map[int64][]runner.Settlement {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		if len(s.settled) >= n {
			out := map[int64][]runner.Settlement{}
			for k, v := range s.settled {
				out[k] = append([]runner.Settlement(nil), v...)
			}
			s.mu.Unlock()
			return out
		}
		s.mu.Unlock()
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("%d offsets settled after 10s, want %d", len(s.settled), n)
		}
	}
}

func recs(offsets ...int64) []runner.Record {
	out := make([]runner.Record, len(offsets))
	for i, o := range offsets {
		out[i] = runner.Record{Topic: topic, Partition: 0, Offset: o, Value: []byte("v"), DeliveryCount: int32(o%3 + 1)}
	}
	return out
}

type okWriter struct{}

func (okWriter) WriteDeadLetter(context.Context, string, runner.Record) error { return nil }

// TestSettledOutcomes: over a Settler every record is settled once, with
// the outcome of its handling, whatever the order of its offsets (below
// ones already delivered too, which the tracker would drop), and nothing is
// committed.
func TestSettledOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy runner.Policy
		fail   runner.Settlement // what the failing record (offset 3) gets
	}{
		{"skip rejects", runner.Skip(2), runner.Rejected},
		{"dead letter accepts", runner.DeadLetter("dlt", 2, okWriter{}), runner.Accepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 5 and 9, then 3 and 5 again below and at offsets delivered.
			src := newSettleSource(
				runner.Batch{TP: tp(0), Records: recs(5, 9), Position: -1, HighWatermark: -1},
				runner.Batch{TP: tp(0), Records: recs(3, 7), Position: -1, HighWatermark: -1},
			)
			var mu sync.Mutex
			counts := map[int64]int32{}
			r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
				mu.Lock()
				counts[rec.Offset] = rec.DeliveryCount
				mu.Unlock()
				if rec.Offset == 3 {
					return errors.New("poison")
				}
				return nil
			}), runner.Failure(tc.policy), runner.Backoff(time.Millisecond, time.Millisecond))
			wait := started(t, r)
			got := src.waitSettled(t, 4)
			want := map[int64]runner.Settlement{5: runner.Accepted, 9: runner.Accepted, 7: runner.Accepted, 3: tc.fail}
			for off, w := range want {
				if len(got[off]) != 1 || got[off][0] != w {
					t.Errorf("offset %d settled %v, want [%v]", off, got[off], w)
				}
			}
			shutdownAndWait(t, r, wait)
			if src.commits != 0 {
				t.Errorf("Commit called %d times over a Settler, want 0", src.commits)
			}
			mu.Lock()
			defer mu.Unlock()
			for off, c := range counts {
				if want := int32(off%3 + 1); c != want {
					t.Errorf("offset %d: handler saw DeliveryCount %d, want %d", off, c, want)
				}
			}
		})
	}
}

// TestSettledShutdownReleases: a shutdown releases the records that had not
// started, settles the one that finished within the budget, and leaves the
// one still running past it to the source (not settled).
func TestSettledShutdownReleases(t *testing.T) {
	t.Parallel()
	src := newSettleSource(runner.Batch{TP: tp(0), Records: recs(1, 2, 3), Position: -1, HighWatermark: -1})
	running := make(chan int64, 3)
	r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		running <- rec.Offset
		<-ctx.Done() // runs past the drain budget
		return ctx.Err()
	}), runner.Failure(runner.Skip(1)), runner.Concurrency(1))
	wait := started(t, r)
	<-src.fed
	first := <-running
	// The drain gets half of it (the default CommitTimeout, 10 s, is more
	// than half); the other half, reserved for the final commit, leaves
	// Run time to return the DrainError before Shutdown's ctx ends, with
	// both CPUs busy (with 300 ms it failed 1 run in 40 under stress-ng
	// --cpu 2, when the drain had 70% of it).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := r.Shutdown(ctx)
	var de *runner.DrainError
	if !errors.As(err, &de) {
		t.Fatalf("Shutdown: %v, want a *DrainError (the handler ran past the budget)", err)
	}
	_ = wait()
	src.mu.Lock()
	defer src.mu.Unlock()
	if got := src.settled[first]; len(got) != 0 {
		t.Errorf("offset %d (running past the budget) settled %v, want none: the source releases it on Close", first, got)
	}
	for _, off := range []int64{1, 2, 3} {
		if off == first {
			continue
		}
		if got := src.settled[off]; len(got) != 1 || got[0] != runner.Released {
			t.Errorf("offset %d (not started) settled %v, want [released]", off, got)
		}
	}
}

// TestSettledRefusesOptions: options that mean nothing over a Settler are
// refused, naming the option.
func TestSettledRefusesOptions(t *testing.T) {
	h := runner.Handle(topic, func(context.Context, runner.Record) error { return nil })
	skip := runner.Failure(runner.Skip(3))
	for _, tc := range []struct {
		option string
		opts   []runner.Option
	}{
		{"Order", []runner.Option{skip, runner.Order(runner.KeyOrder)}},
		{"Order", []runner.Option{skip, runner.Order(runner.PartitionOrder)}},
		{"Failure", nil},
		{"Failure", []runner.Option{runner.Failure(runner.Block())}},
		{"CommitInterval", []runner.Option{skip, runner.CommitInterval(time.Minute)}},
		{"CommitTimeout", []runner.Option{skip, runner.CommitTimeout(time.Minute)}},
		{"Window", []runner.Option{skip, runner.Window(1 << 20)}},
		{"OnAssign", []runner.Option{skip, runner.OnAssign(func(context.Context, []runner.Assignment) ([]runner.Applied, error) { return nil, nil })}},
	} {
		_, err := runner.New(newSettleSource(), append([]runner.Option{h}, tc.opts...)...)
		var ce *runner.ConfigError
		if !errors.As(err, &ce) || ce.Option != tc.option {
			t.Errorf("%s: New returned %v, want a *ConfigError for %s", tc.option, err, tc.option)
		}
	}
	if _, err := runner.New(newSettleSource(), h, skip, runner.Order(runner.Unordered)); err != nil {
		t.Errorf("Unordered with Skip: %v, want nil", err)
	}
	// A topic's own policy counts: Block on one topic is refused under
	// its name. The runner-wide Block is refused even when every topic
	// has its own policy: records of a topic none registered run under
	// it (TestSettledUnroutedIsNotBlocked).
	noop := func(context.Context, runner.Record) error { return nil }
	_, err := runner.New(newSettleSource(), skip, runner.Handle("a", noop), runner.Handle("b", noop, runner.WithPolicy(runner.Block())))
	var ce *runner.ConfigError
	if !errors.As(err, &ce) || ce.Option != `Handle("b").WithPolicy` {
		t.Errorf("Block on topic b: New returned %v, want a *ConfigError for Handle(\"b\").WithPolicy", err)
	}
	_, err = runner.New(newSettleSource(), runner.Handle("a", noop, runner.WithPolicy(runner.Skip(2))))
	if !errors.As(err, &ce) || ce.Option != "Failure" {
		t.Errorf("the default Block with every topic on Skip: New returned %v, want a *ConfigError for Failure", err)
	}
}
