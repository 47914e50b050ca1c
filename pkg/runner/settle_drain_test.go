package runner_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestSettledDrainNamesTheRecord: in settled mode there is no safe offset,
// so a shutdown past its budget names, in its *DrainError, the lowest
// offset still running of each partition (not -1), and the partition's
// log line says it stopped, with no revoke, safe or acknowledged offset.
func TestSettledDrainNamesTheRecord(t *testing.T) {
	t.Parallel()
	src := newSettleSource(runner.Batch{TP: tp(0), Records: recs(7, 4, 9), Position: -1, HighWatermark: -1})
	var logs logBuffer
	running := make(chan int64, 3)
	r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		running <- rec.Offset
		<-ctx.Done() // runs past the drain budget
		return ctx.Err()
	}), runner.Failure(runner.Skip(1)), runner.Concurrency(2), runner.Logger(logs.logger()))
	wait := started(t, r)
	<-src.fed
	a, b := <-running, <-running
	// The drain gets half of it (1 s: the default CommitTimeout, 10 s, is
	// more than half); the other half, reserved for the final commit,
	// leaves Run time to return the DrainError before Shutdown's ctx
	// ends, with both CPUs busy.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := r.Shutdown(ctx)
	_ = wait()
	var de *runner.DrainError
	if !errors.As(err, &de) {
		t.Fatalf("Shutdown: %v, want a *DrainError (two handlers ran past the budget)", err)
	}
	want := min(a, b) // 4 and 7 ran (Concurrency 2); 9 was released unrun
	if got, ok := de.Unfinished[tp(0)]; !ok || got != want || len(de.Unfinished) != 1 {
		t.Errorf("DrainError.Unfinished = %v, want {%s: %d}, the lowest offset still running", de.Unfinished, tp(0), want)
	}
	if msg, rec := de.Error(), tp(0).String()+"@"+strconv.FormatInt(want, 10); !strings.Contains(msg, rec) || strings.Contains(msg, "@-1") {
		t.Errorf("DrainError says %q, want it to name %s", msg, rec)
	}
	if !logs.has("partition stopped", "partition=t/0", "unfinished=2") {
		t.Errorf("no \"partition stopped\" line for t/0 with unfinished=2 in the log:\n%s", logs.String())
	}
	for _, bad := range []string{"partition revoked", "safe=-1", "acknowledged=-1"} {
		if logs.has(bad) {
			t.Errorf("the log says %q over a share source, where nothing is revoked or committed:\n%s", bad, logs.String())
		}
	}
}
