package shutdown_test

import (
	"context"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestCloserOutOfTimeIsNotExit3: the runner stops cleanly at
// once; a closer then runs out of its ctx, as http.Server.Shutdown does
// when a request is still open at the budget (it returns ctx.Err()).
// Nothing of the drain or the final commit went wrong, so by ExitCode's doc
// ("3 when the drain budget ran out or the final commit was not
// acknowledged (records were left to the next owner ...) ... 1
// otherwise") and docs/operations.md's Exit status list, the status is 1.
// ExitCode once matched context.DeadlineExceeded anywhere in the joined error
// and answers 3, telling the operator that records were left to the next
// owner when none were.
func TestCloserOutOfTimeIsNotExit3(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{start: time.Now()}
		c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(20*time.Second),
			shutdown.Close(shutdown.Closer{Name: "http", Close: func(ctx context.Context) error {
				<-ctx.Done() // a request that outlives the closers' reserve
				return ctx.Err()
			}}))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Stop(nil)
		if err == nil {
			t.Fatal("Stop = nil; want the closer's error")
		}
		if code := shutdown.ExitCode(err); code != 1 {
			t.Errorf("Stop = %v: ExitCode %d, want 1 (a closer failed; the drain and the final commit did not)", err, code)
		}
	})
}

// TestWaitOnAClosedSignalChannel: a program that asks for
// the stop by closing its channel (the Go idiom for "stop", e.g. a test
// or a supervisor that stops the service) makes Wait receive a nil
// os.Signal; Wait's log line once called sig.String() on it: a nil pointer
// panic instead of a graceful stop. Stop's second-signal case has the same
// call (sig.String() in its Warn).
func TestWaitOnAClosedSignalChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{start: time.Now()}
		c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		sigs := make(chan os.Signal)
		close(sigs)
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Wait on a closed signal channel panicked: %v", p)
			}
		}()
		_ = c.Wait(context.Background(), sigs)
	})
}

// TestReserveHoldsWhenRunsCtxEndsToo: a program that keeps
// the README's signal.NotifyContext for Run's ctx and adds the
// coordinator (docs/operations.md says nothing against it) gets both on
// one SIGTERM: Run's ctx ends, and Stop calls ShutdownWithin. The
// runner's first stop once won ("a second stop changes nothing",
// pollState.stop): the drain runs for DrainBudget (10s) with no final
// commit deadline, past the coordinator's 6s drain end and its 9s runner
// end. At 9s the coordinator closes the runner: the handler is cancelled
// at 9s, not 6s, and no final commit is made at all — records 0 and 1,
// handled, are replayed by the next owner, where the Reserve split would
// have committed them at 6s.
func TestReserveHoldsWhenRunsCtxEndsToo(t *testing.T) {
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
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(runCtx) }()
		if err := src.Assign(context.Background(), runner.TP{Topic: topic}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // 0 and 1 handled, 2 running
		start = time.Now()
		signalled() // the SIGTERM ends Run's ctx ...
		synctest.Wait()
		// ... and the coordinator stops the runner.
		_, err = stopOnce(t, r, start, shutdown.Budget(10*time.Second), shutdown.Reserve(3*time.Second, time.Second))
		if at := <-cancelledAt; at != 6*time.Second {
			t.Errorf("the handler past the drain was cancelled %v after the signal, want 6s (10s − 3s − 1s, Reserve's split)", at)
		}
		if off, ok := src.Committed(runner.TP{Topic: topic}); !ok || off != 2 {
			t.Errorf("committed %d (%v), want 2: the final commit of records 0 and 1 (Stop = %v)", off, ok, err)
		}
		<-runErr
	})
}
