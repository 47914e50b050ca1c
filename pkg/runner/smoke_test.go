package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

func TestConsumesAndCommitsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 4, 1000, 37)
		var handled atomic.Int64
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			handled.Add(1)
			return nil
		}), runner.CommitInterval(5*time.Millisecond))
		wait := started(t, r)
		assign(t, src, tp(0), tp(1), tp(2), tp(3))
		for p := range int32(4) {
			await(t, time.Second, "commit at the end", committedAt(src, p, 1000))
		}
		if got := handled.Load(); got != 4000 {
			t.Fatalf("handled %d records, want 4000", got)
		}
		if err := r.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := wait(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !src.Closed() {
			t.Fatal("source not closed after Run returned")
		}
		if err := src.Violation(); err != nil {
			t.Fatal(err)
		}
	})
}
