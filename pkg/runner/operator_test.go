package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// partStats returns r's stats of partition p, or fails the test.
func partStats(t *testing.T, r *runner.Runner, p int32) runner.PartitionStats {
	t.Helper()
	for _, ps := range r.Stats().Partitions {
		if ps.TP == tp(p) {
			return ps
		}
	}
	t.Fatalf("no stats for %s: %+v", tp(p), r.Stats())
	return runner.PartitionStats{}
}

// TestOperatorPauseSurvivesFlowResume: a partition paused by flow control
// at its high water mark and then by the operator stays paused when its
// records drain below the low water mark, where flow control alone would
// resume it; the operator's resume lets it fetch again.
func TestOperatorPauseSurvivesFlowResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const high, low, n = 40, 10, 200
		src := runnertest.New()
		src.BatchSize = 25
		fill(src, 1, n, 1000)
		release := make(chan struct{})
		var handled atomic.Int64
		h := func(ctx context.Context, rec runner.Record) error {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			handled.Add(1)
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.Order(runner.Unordered),
			runner.Concurrency(4), runner.WaterMarks(high, low), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "paused by flow control at the high water mark", func() bool { return src.Paused(tp(0)) })
		if c := partStats(t, r, 0).PausedBy; c != runner.PausedFlow {
			t.Fatalf("paused by %q, want flow", c)
		}
		if err := r.PausePartitions(context.Background(), tp(0)); err != nil {
			t.Fatal(err)
		}
		fetched := partStats(t, r, 0).Fetched
		// Every record fetched runs to the end: flow control would resume
		// the partition at the low water mark.
		close(release)
		await(t, time.Second, "the fetched records handled", func() bool { return handled.Load() == fetched+1 })
		time.Sleep(time.Second) // fake time: a few hundred ticks and polls
		synctest.Wait()
		st := partStats(t, r, 0)
		if !src.Paused(tp(0)) || st.Fetched != fetched || handled.Load() != fetched+1 {
			t.Fatalf("flow control resumed an operator's pause: source paused %v, fetched %d (was %d), handled %d",
				src.Paused(tp(0)), st.Fetched, fetched, handled.Load())
		}
		if st.PausedBy != runner.PausedOperator {
			t.Fatalf("paused by %q, want operator", st.PausedBy)
		}
		if err := r.ResumePartitions(context.Background(), tp(0)); err != nil {
			t.Fatal(err)
		}
		await(t, time.Second, "every record handled after the resume", func() bool { return handled.Load() == n })
		if got := r.OperatorPaused(); len(got.Partitions)+len(got.Topics) != 0 {
			t.Fatalf("operator pauses left after the resume: %+v", got)
		}
	})
}

// TestOperatorPauseSurvivesReassign: a partition the operator paused that
// is revoked and assigned back starts paused (no record of the new
// assignment is fetched) until the operator resumes it; so does one paused
// through its topic before it was ever assigned.
func TestOperatorPauseSurvivesReassign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		fill(src, 2, 50, 10)
		var handled [2]atomic.Int64
		h := func(ctx context.Context, rec runner.Record) error {
			handled[rec.Partition].Add(1)
			return nil
		}
		r := newRunner(t, src, runner.Handle(topic, h), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		ctx := context.Background()
		// Paused before the first assignment, by partition and by topic.
		if err := r.PausePartitions(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		assign(t, src, tp(0))
		await(t, time.Second, "the partition paused at its assignment", func() bool { return src.Paused(tp(0)) })
		if handled[0].Load() != 0 {
			t.Fatalf("%d records of a partition paused before its assignment were handled", handled[0].Load())
		}
		if err := r.ResumePartitions(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		await(t, time.Second, "partition 0 consumed", committedAt(src, 0, 50))

		if err := r.PauseTopics(ctx, topic); err != nil {
			t.Fatal(err)
		}
		if err := src.Revoke(ctx, tp(0)); err != nil {
			t.Fatal(err)
		}
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 50, Value: []byte("v")})
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "both partitions paused after the reassignment", func() bool { return src.Paused(tp(0)) && src.Paused(tp(1)) })
		if a, b := handled[0].Load(), handled[1].Load(); a != 50 || b != 0 {
			t.Fatalf("handled %d and %d records with the topic paused, want 50 and 0", a, b)
		}
		if got := r.OperatorPaused(); !slices.Equal(got.Topics, []string{topic}) || len(got.Partitions) != 0 {
			t.Fatalf("OperatorPaused = %+v, want the topic alone", got)
		}
		err := r.ResumePartitions(ctx, tp(1))
		if err == nil || !strings.Contains(err.Error(), "paused as a whole") {
			t.Fatalf("resuming a partition of a paused topic: %v, want an error saying to resume the topic", err)
		}
		if err := r.ResumeTopics(ctx, topic); err != nil {
			t.Fatal(err)
		}
		await(t, time.Second, "both consumed after the topic's resume", func() bool {
			return committedAt(src, 0, 51)() && committedAt(src, 1, 50)()
		})
	})
}

// TestOperatorPauseErrors: a topic without a handler, a negative partition,
// and a stopped runner are refused with errors that name them.
func TestOperatorPauseErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }))
		wait := started(t, r)
		ctx := context.Background()
		if err := r.PauseTopics(ctx, "nope"); !errors.Is(err, runner.ErrNotHandled) || !strings.Contains(err.Error(), `"nope"`) {
			t.Fatalf("PauseTopics(nope) = %v, want ErrNotHandled naming it", err)
		}
		if err := r.PausePartitions(ctx, runner.TP{Topic: "nope", Partition: 1}); !errors.Is(err, runner.ErrNotHandled) {
			t.Fatalf("PausePartitions(nope/1) = %v, want ErrNotHandled", err)
		}
		if err := r.PausePartitions(ctx, tp(-1)); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Fatalf("PausePartitions(t/-1) = %v, want an error", err)
		}
		if err := r.ResumePartitions(ctx, tp(3)); err != nil {
			t.Fatalf("resuming a partition not paused: %v, want nil", err)
		}
		if err := r.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		_ = wait()
		if err := r.PauseTopics(ctx, topic); !errors.Is(err, runner.ErrStopped) {
			t.Fatalf("PauseTopics after Run returned: %v, want ErrStopped", err)
		}
	})
}

// TestPartitionStatsForTheStatusPage: the fetched offset, the dead-letter
// and fenced counts, the lanes in use and the oldest unfinished record's
// key in printable form.
func TestPartitionStatsForTheStatusPage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		stuckKey := []byte("<script>\xff")
		recs := []runner.Record{
			{Topic: topic, Partition: 0, Offset: 0, Key: []byte("poison"), Value: []byte("v")},
			{Topic: topic, Partition: 0, Offset: 1, Key: []byte("fenced"), Value: []byte("v")},
			{Topic: topic, Partition: 0, Offset: 2, Key: stuckKey, Value: []byte("v")},
			{Topic: topic, Partition: 0, Offset: 3, Key: []byte("a"), Value: []byte("v")},
			{Topic: topic, Partition: 0, Offset: 4, Key: []byte("a"), Value: []byte("v")},
		}
		src.Append(recs...)
		src.Append(runner.Record{Topic: topic, Partition: 1, Offset: 0, Key: stuckKey, Value: []byte("v")})
		hold := make(chan struct{})
		t.Cleanup(func() { close(hold) })
		h := func(ctx context.Context, rec runner.Record) error {
			switch string(rec.Key) {
			case "poison":
				return runner.Permanent(errors.New("bad order"))
			case "fenced":
				return fmt.Errorf("lease moved: %w", runner.ErrFenced)
			case "a":
				return nil
			}
			select { // the stuck records
			case <-hold:
			case <-ctx.Done():
			}
			return ctx.Err()
		}
		d := &dlq{allow: make(chan struct{})}
		close(d.allow)
		r := newRunner(t, src, runner.Handle(topic, h, runner.WithPolicy(runner.DeadLetter("t.dlq", 1, d))),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src, tp(0), tp(1))
		await(t, time.Second, "the records other than the stuck ones done", func() bool {
			st := partStats(t, r, 0)
			return st.DeadLettered == 1 && st.Fenced == 1 && st.InFlight == 1 && st.Buffered == 1
		})
		st := partStats(t, r, 0)
		if st.Fetched != 4 || st.Lanes != 2 || st.OldestOffset != 1 || st.OldestState != runner.Fenced || st.OldestKey != "fenced" {
			t.Fatalf("stats %+v: want fetched 4, 2 lanes in use (the fenced key's, held, and the stuck one's), oldest t/0@1 fenced with key fenced", st)
		}
		st = partStats(t, r, 1)
		if st.OldestOffset != 0 || st.OldestState != runner.Running || st.OldestKey != `"<script>\xff"` || st.Lanes != 1 {
			t.Fatalf("stats %+v: want the stuck record t/1@0 running, its key quoted, 1 lane in use", st)
		}
	})
}

// TestPrintableKey: the stats' printable form of a key.
func TestPrintableKey(t *testing.T) {
	long := strings.Repeat("é", 40) // 80 bytes
	for _, c := range []struct {
		key  []byte
		want string
	}{
		{nil, ""},
		{[]byte{}, `""`},
		{[]byte("customer-7"), "customer-7"},
		{[]byte("<script>alert(1)</script>"), "<script>alert(1)</script>"}, // escaping is the page's
		{[]byte("a\xffb"), `"a\xffb"`},
		{[]byte("tab\there"), `"tab\there"`},
		{[]byte(long), strings.Repeat("é", 32) + "…(80 bytes)"},
		{[]byte(strings.Repeat("x", 63) + "é"), strings.Repeat("x", 63) + "…(65 bytes)"},
	} {
		if got := runner.PrintableKeyForTest(c.key); got != c.want {
			t.Errorf("printableKey(%q) = %q, want %q", c.key, got, c.want)
		}
	}
}

// TestPauseCauseString names every cause.
func TestPauseCauseString(t *testing.T) {
	for c, want := range map[runner.PauseCause]string{
		0:                 "",
		runner.PausedFlow: "flow",
		runner.PausedWindow | runner.PausedOperator: "window,operator",
		runner.PausedMemory | runner.PausedStopping: "memory,stopping",
		runner.PausedFlow | 1<<6:                    "flow,PauseCause(64)",
	} {
		if got := c.String(); got != want {
			t.Errorf("PauseCause(%d) = %q, want %q", c, got, want)
		}
	}
}
