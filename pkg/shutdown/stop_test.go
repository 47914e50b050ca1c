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

// TestReserveHoldsWhenRunsCtxEndsToo: a program that keeps the README's
// signal.NotifyContext for Run's ctx and adds the coordinator gets both
// on one SIGTERM: Run's ctx ends, and Stop calls ShutdownWithin, in
// either order. The runner once kept the first stop ("a second stop
// changes nothing"): with Run's ctx first, the drain ran for DrainBudget
// (10s) with no final-commit deadline, past the coordinator's 6s drain
// end and its 9s runner end; at 9s the coordinator closed the runner, so
// the handler was cancelled at 9s, not 6s, and no final commit was made —
// records 0 and 1, handled, would be replayed by the next owner. Either
// way Reserve's split must hold: the handler past the drain is cancelled
// at 6s (10s − 3s − 1s), records 0 and 1 are committed by the final
// commit, and the closers are called at 6s with 4s left.
func TestReserveHoldsWhenRunsCtxEndsToo(t *testing.T) {
	for _, ctxFirst := range []bool{true, false} {
		name := "Run's ctx first"
		if !ctxFirst {
			name = "the coordinator's stop first"
		}
		t.Run(name, func(t *testing.T) { reserveHoldsWithBothStops(t, ctxFirst) })
	}
}

func reserveHoldsWithBothStops(t *testing.T, ctxFirst bool) {
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
		if ctxFirst {
			signalled()
			synctest.Wait()
		}
		type stopped struct {
			cl  *closerLeft
			err error
		}
		stop := make(chan stopped, 1)
		go func() {
			cl, err := stopOnce(t, r, start, shutdown.Budget(10*time.Second), shutdown.Reserve(3*time.Second, time.Second))
			stop <- stopped{cl, err}
		}()
		if !ctxFirst {
			synctest.Wait() // the coordinator's stop reached the runner ...
			signalled()     // ... then the SIGTERM ends Run's ctx
		}
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
