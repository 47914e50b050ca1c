package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// TestHandlerDurationRecorded: with a meter provider that records, every
// handled record has its duration measured (the runner reads the clock only
// when the histogram is enabled) and counted as handled.
func TestHandlerDurationRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 50, 10)
		m := newMeter()
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
			time.Sleep(time.Millisecond)
			return nil
		}), runner.MeterProvider(m.provider), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "every record handled", func() bool { return m.sum(t, "tidemark.records.handled") == 100 })
		if n := m.count(t, "tidemark.handler.duration"); n != 100 {
			t.Fatalf("handler duration recorded %d times, want 100", n)
		}
	})
}
