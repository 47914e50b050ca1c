package shutdown_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestClosedSignalChannelIsNoSecondSignal: a closed signal channel is
// never a second signal. Wait takes the close as the request to stop (the
// first signal) and Stop, given a closed channel, waits for the runner as
// with no channel at all: the stop is graceful (no Close, no ErrForced)
// and ends when the runner does. (Stop's second-signal case received the
// close as a nil os.Signal and called its String method: a panic.)
func TestClosedSignalChannelIsNoSecondSignal(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(c *shutdown.Coordinator, sigs <-chan os.Signal) error
	}{
		{"Wait", func(c *shutdown.Coordinator, sigs <-chan os.Signal) error { return c.Wait(context.Background(), sigs) }},
		{"Stop", func(c *shutdown.Coordinator, sigs <-chan os.Signal) error { return c.Stop(sigs) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeRunner{start: time.Now(), stop: func(ctx context.Context) error {
					time.Sleep(time.Second) // a drain that takes 1 s
					return nil
				}}
				c, err := shutdown.NewCoordinator(drainer{f}, shutdown.Budget(20*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				sigs := make(chan os.Signal)
				close(sigs)
				err = func() (err error) {
					defer func() {
						if p := recover(); p != nil {
							err = errors.New("panicked")
						}
					}()
					return tc.stop(c, sigs)
				}()
				f.mu.Lock()
				calls := strings.Join(f.calls, ",")
				f.mu.Unlock()
				if took := time.Since(f.start); err != nil || took != time.Second || calls != "shutdown-within" {
					t.Errorf("%s on a closed channel = %v after %v with runner calls %q, want nil after 1s (the drain's end) with shutdown-within alone",
						tc.name, err, took, calls)
				}
			})
		})
	}
}
