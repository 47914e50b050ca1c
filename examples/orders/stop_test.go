package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/shutdown"
)

// TestSecondSignalExitsPromptly: after a second signal — during the
// coordinator's Stop (ErrForced) or while waiting for Run after a graceful
// one — the process waits for Run at most forcedGrace and exits 4, even
// when a handler never honours its cancelled ctx; without one it waits as
// long as Run takes, with Stop's result. (It waited for Run however long
// that took.)
func TestSecondSignalExitsPromptly(t *testing.T) {
	forced := errors.Join(shutdown.ErrForced)
	for _, tc := range []struct {
		name     string
		stopErr  error
		signalAt time.Duration // 0: no signal after Stop
		runAt    time.Duration // when Run returns; 0: never
		took     time.Duration
		code     int
	}{
		{"forced, Run never returns", forced, 0, 0, forcedGrace, 4},
		{"forced, Run returns in the grace", forced, 0, 100 * time.Millisecond, 100 * time.Millisecond, 4},
		{"graceful, then a signal, Run never returns", nil, 2 * time.Second, 0, 2*time.Second + forcedGrace, 4},
		{"graceful, Run returns late", nil, 0, 5 * time.Second, 5 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				runDone := make(chan error, 1)
				sigs := make(chan os.Signal, 1)
				release := make(chan struct{}) // ends the goroutines below
				defer close(release)
				if tc.runAt > 0 {
					go func() {
						select {
						case <-time.After(tc.runAt):
							runDone <- nil
						case <-release:
						}
					}()
				}
				if tc.signalAt > 0 {
					go func() {
						select {
						case <-time.After(tc.signalAt):
							sigs <- syscall.SIGINT
						case <-release:
						}
					}()
				}
				start := time.Now()
				err := awaitRun(slog.New(slog.NewTextHandler(io.Discard, nil)), tc.stopErr, runDone, sigs, forcedGrace)
				if took, code := time.Since(start), shutdown.ExitCode(err); took != tc.took || code != tc.code {
					t.Errorf("awaitRun = %v after %v (exit %d), want after %v, exit %d", err, took, code, tc.took, tc.code)
				}
			})
		})
	}
}
