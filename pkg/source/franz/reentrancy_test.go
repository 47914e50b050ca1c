package franz_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// commitWaitSink is a Sink whose Fetched does what a runner may do before
// it answers: it pauses and resumes the partitions handed over, and waits
// for a commit of their positions, made by another goroutine (the
// runner's commit goroutine), to be answered.
type commitWaitSink struct {
	src     *franz.Source
	commits chan<- []runner.Offset
	results <-chan error

	mu   sync.Mutex
	seen map[runner.TP]int
	errs []error
}

func (s *commitWaitSink) Assigned(context.Context, []runner.Assignment) error { return nil }
func (s *commitWaitSink) Revoked(context.Context, []runner.TP, time.Time) error {
	return nil
}
func (s *commitWaitSink) Lost(context.Context, []runner.TP) error { return nil }

func (s *commitWaitSink) Fetched(ctx context.Context, bs []runner.Batch) (int, error) {
	var offs []runner.Offset
	for _, b := range bs {
		s.src.Pause([]runner.TP{b.TP})
		s.src.Resume([]runner.TP{b.TP})
		s.mu.Lock()
		s.seen[b.TP] += len(b.Records)
		s.mu.Unlock()
		if b.Position >= 0 {
			offs = append(offs, runner.Offset{TP: b.TP, Offset: b.Position})
		}
	}
	if len(offs) == 0 {
		return 10, nil
	}
	s.commits <- offs
	select {
	case err := <-s.results:
		if err != nil {
			s.fail(fmt.Errorf("Commit(%v) from another goroutine during Fetched: %w", offs, err))
		}
	case <-time.After(10 * time.Second):
		s.fail(fmt.Errorf("Commit(%v) from another goroutine did not return in 10s while Sink.Fetched waited for it: the poll path holds something Commit needs across Fetched", offs))
		return 0, errors.New("stuck")
	case <-ctx.Done():
	}
	return 10, nil
}

func (s *commitWaitSink) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *commitWaitSink) state() (seen int, errs []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.seen {
		seen += n
	}
	return seen, append([]error(nil), s.errs...)
}

// TestFetchedMayPauseResumeAndWaitForCommit: the runner may call Pause and
// Resume from inside Sink.Fetched, and Fetched may wait for a Commit made
// on another goroutine (the runner's commit goroutine, while the runner
// waits for room); the source holds nothing across Fetched that either
// needs. Every record arrives, and every commit made meanwhile returns and
// is acknowledged.
func TestFetchedMayPauseResumeAndWaitForCommit(t *testing.T) {
	t.Parallel()
	const perPartition = 50
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 2)
	produce(c, "t", 2, perPartition, 10)
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.MaxPollRecords(7))
	if err != nil {
		t.Fatal(err)
	}
	commits, results := make(chan []runner.Offset), make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		for {
			select {
			case offs := <-commits:
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				err := src.Commit(cctx, offs)
				ccancel()
				select {
				case results <- err:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-committerDone
	})
	sink := &commitWaitSink{src: src, commits: commits, results: results, seen: map[runner.TP]int{}}
	runSource(t, src, sink)

	kafkatest.WaitFor(t, 20*time.Second, "every record handed over and committed", func() bool {
		seen, errs := sink.state()
		if len(errs) > 0 {
			return true
		}
		done := c.Committed("g", "t")
		return seen == 2*perPartition && done[0] == perPartition && done[1] == perPartition
	})
	if _, errs := sink.state(); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
}
