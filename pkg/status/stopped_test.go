package status_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/status"
)

// TestPageAfterRunReturned: once Run returned the runner owns nothing and
// is in no group; the page must not go on showing the partitions of its
// last snapshot as owned, nor the member as joined.
func TestPageAfterRunReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		tp := runner.TP{Topic: "t", Partition: 0}
		r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
			runner.CommitInterval(2*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		if err := src.Assign(context.Background(), tp); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if err := r.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		_, body := get(t, status.New(r).Handler(), "/tidemark.json")
		var d status.Doc
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatal(err)
		}
		if len(d.Partitions) != 0 || d.Member.Joined {
			t.Errorf("after Run returned the page shows %d partitions owned and joined=%v, want none and not joined (stopping=%v)", len(d.Partitions), d.Member.Joined, d.Stopping)
		}
	})
}

// TestPageShowsStopped: the snapshot of a stopped runner shows as
// "stopped" on the page and in its JSON, with no partition and not joined.
func TestPageShowsStopped(t *testing.T) {
	f := newFake()
	f.stats = runner.Stats{Stopping: true, Stopped: true, Member: runner.MemberStats{Group: "orders"}}
	h := status.New(f).Handler()
	_, page := get(t, h, "/tidemark")
	for _, want := range []string{`<b id="state" class="bad">stopped</b>`, "No partition assigned", `<span id="joined" class="bad">not joined</span>`} {
		if !contains(page, want) {
			t.Errorf("the page of a stopped runner lacks %q:\n%s", want, page)
		}
	}
	_, body := get(t, h, "/tidemark.json")
	var d status.Doc
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if !d.Stopped || !d.Stopping || len(d.Partitions) != 0 {
		t.Errorf("JSON of a stopped runner: stopped=%v stopping=%v partitions=%d", d.Stopped, d.Stopping, len(d.Partitions))
	}
}

// TestStoppedWithoutShutdown: a runner closed without a shutdown (as after
// a source failure) publishes its stopped snapshot too, but not as
// stopping: liveness tells a runner that died from one that was shut down
// by Stopping, and must fail for the first.
func TestStoppedWithoutShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
			runner.CommitInterval(2*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		probes := shutdown.NewProbes(r, time.Second)
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		probes.Started()
		if err := src.Assign(context.Background(), runner.TP{Topic: "t", Partition: 0}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		r.Close()
		<-done
		probes.Stopped()
		s := r.Stats()
		if !s.Stopped || s.Stopping || len(s.Partitions) != 0 || s.Member.Joined {
			t.Errorf("after Close: stopped=%v stopping=%v partitions=%d joined=%v; want true, false, 0, false",
				s.Stopped, s.Stopping, len(s.Partitions), s.Member.Joined)
		}
		if live, why := probes.Live(); live {
			t.Errorf("a runner closed without a shutdown is live (%q)", why)
		}
	})
}
