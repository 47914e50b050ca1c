package runner_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
)

// lateSource is a source whose Run starts only after the runner closed it,
// as a goroutine scheduled late on a loaded machine does, and then answers
// as franz's and kafkago's sources do: Run after Close returns their
// "closed" error.
type lateSource struct {
	closed chan struct{}
}

func (s *lateSource) Run(ctx context.Context, _ runner.Sink) error {
	<-s.closed
	return errors.New("late: source closed")
}
func (s *lateSource) Pause([]runner.TP)                             {}
func (s *lateSource) Resume([]runner.TP)                            {}
func (s *lateSource) Commit(context.Context, []runner.Offset) error { return nil }
func (s *lateSource) Close() error                                  { close(s.closed); return nil }

// TestStopAtStartIsClean: a program stopped by a signal right as it
// starts (Run's ctx already done) stops cleanly, even when the source's Run
// only began after the runner closed it. Run returned the source's
// "closed" error; the quickstart's SIGTERM test failed so under load:
//
//	stderr "quickstart: the runner: franz: source closed\n"
func TestStopAtStartIsClean(t *testing.T) {
	src := &lateSource{closed: make(chan struct{})}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run with its ctx done at start = %v, want nil: the source's answer to the runner's own Close is no failure", err)
	}
}
