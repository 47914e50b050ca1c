package status_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// startRunner runs a runner of one partition under probes that were told
// Started, as examples/orders does (which never calls Probes.Stopped).
func startRunner(t *testing.T) (*runner.Runner, *shutdown.Probes, chan error) {
	src := runnertest.New()
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
		runner.CommitInterval(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	probes := shutdown.NewProbes(r, time.Second)
	done := make(chan error, 1)
	probes.Started()
	go func() { done <- r.Run(context.Background()) }()
	if err := src.Assign(context.Background(), runner.TP{Topic: "t", Partition: 0}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	synctest.Wait()
	return r, probes, done
}

// TestLiveAfterCloseFromStats: the runner's final snapshot says its loop
// ended without a shutdown (Stopped, not Stopping), which its doc says is
// how liveness tells a dead runner from a shut-down one. Probes.Live reads
// only its own Stopped flag, which nothing in the repo sets (the orders
// example and the Coordinator never call Probes.Stopped): a closed runner
// is reported live until maxStall passes.
func TestLiveAfterCloseFromStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, probes, done := startRunner(t)
		r.Close()
		<-done
		if s := r.Stats(); !s.Stopped || s.Stopping {
			t.Fatalf("after Close: stopped=%v stopping=%v", s.Stopped, s.Stopping)
		}
		if live, why := probes.Live(); live {
			t.Errorf("a runner whose Run returned on Close is live (%q); its Stats say Stopped without a shutdown", why)
		}
	})
}

// TestLiveAfterShutdownFromStats: after a shutdown the loop's tick stops
// too; liveness must not fail on its age while the process closes the rest
// (Coordinator's closers), since a restart then would cut the close short.
func TestLiveAfterShutdownFromStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, probes, done := startRunner(t)
		if err := r.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-done
		time.Sleep(2 * time.Second) // past maxStall, closers still running
		if live, why := probes.Live(); !live {
			t.Errorf("a runner shut down cleanly is not live %s after (%q); its Stats say Stopped after a shutdown", 2*time.Second, why)
		}
	})
}
