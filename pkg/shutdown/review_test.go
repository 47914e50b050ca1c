package shutdown_test

import (
	"context"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestReviewCloserOutOfTimeIsNotExit3 (fails): the runner stops cleanly at
// once; a closer then runs out of its ctx, as http.Server.Shutdown does
// when a request is still open at the budget (it returns ctx.Err()).
// Nothing of the drain or the final commit went wrong, so by ExitCode's doc
// ("3 when the drain budget ran out or the final commit was not
// acknowledged (records were left to the next owner ...) ... 1
// otherwise") and docs/operations.md's Exit status list, the status is 1.
// ExitCode matches context.DeadlineExceeded anywhere in the joined error
// and answers 3, telling the operator that records were left to the next
// owner when none were.
func TestReviewCloserOutOfTimeIsNotExit3(t *testing.T) {
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

// TestReviewWaitOnAClosedSignalChannel (fails): a program that asks for
// the stop by closing its channel (the Go idiom for "stop", e.g. a test
// or a supervisor that stops the service) makes Wait receive a nil
// os.Signal, and Wait's log line calls sig.String() on it: a nil pointer
// panic instead of a graceful stop. Stop's second-signal case has the same
// call (sig.String() in its Warn).
func TestReviewWaitOnAClosedSignalChannel(t *testing.T) {
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
