package shutdown_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestReserveHoldsWhenStopComesBeforeRunsCtxEnds is
// TestReserveHoldsWhenRunsCtxEndsToo in the other order: the
// coordinator's ShutdownWithin reaches the runner first, then Run's ctx
// (signal.NotifyContext's) ends. Reserve's split holds either way: the
// handler past the drain is cancelled at 6 s and records 0 and 1 are
// committed by the final commit.
func TestReserveHoldsWhenStopComesBeforeRunsCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		for off := range int64(3) {
			src.Append(runner.Record{Topic: topic, Partition: 0, Offset: off, Key: []byte{byte('a' + off)}})
		}
		var start time.Time
		cancelledAt := make(chan time.Duration, 1)
		r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 2 {
				<-ctx.Done()
				cancelledAt <- time.Since(start)
				return ctx.Err()
			}
			return nil
		}), runner.CommitInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, signalled := context.WithCancel(context.Background()) // signal.NotifyContext's ctx
		defer signalled()
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(runCtx) }()
		if err := src.Assign(context.Background(), runner.TP{Topic: topic}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // 0 and 1 handled, 2 running
		start = time.Now()
		type stopped struct {
			cl  *closerLeft
			err error
		}
		stop := make(chan stopped, 1)
		go func() {
			cl, err := stopOnce(t, r, start, shutdown.Budget(10*time.Second), shutdown.Reserve(3*time.Second, time.Second))
			stop <- stopped{cl, err}
		}()
		synctest.Wait() // the coordinator's stop reached the runner ...
		signalled()     // ... then the SIGTERM ends Run's ctx
		s := <-stop
		if at := <-cancelledAt; at != 6*time.Second {
			t.Errorf("the handler past the drain was cancelled %v after the signal, want 6s (10s − 3s − 1s, Reserve's split)", at)
		}
		if off, ok := src.Committed(runner.TP{Topic: topic}); !ok || off != 2 {
			t.Errorf("committed %d (%v), want 2: the final commit of records 0 and 1 (Stop = %v)", off, ok, s.err)
		}
		if s.cl.at != 6*time.Second || s.cl.left != 4*time.Second {
			t.Errorf("closers called %v after the signal with %v left, want at 6s with 4s", s.cl.at, s.cl.left)
		}
		<-runErr
	})
}
