package status_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/status"
)

// TestControlsPauseTheRunner: the page's pause reaches a real runner's
// source, shows on the page, and its resume lets the records through.
func TestControlsPauseTheRunner(t *testing.T) {
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
		defer func() { r.Close(); <-done }()
		if err := src.Assign(context.Background(), tp); err != nil {
			t.Fatal(err)
		}
		h := status.New(r, status.Controls(true)).Handler()
		if res := post(h, "/tidemark/pause", url.Values{"topic": {"t"}, "partition": {"0"}}, nil); res.StatusCode != http.StatusOK {
			t.Fatalf("POST pause: %d", res.StatusCode)
		}
		if !src.Paused(tp) {
			t.Fatal("the source was not paused when the pause returned")
		}
		src.Append(runner.Record{Topic: "t", Partition: 0, Offset: 0, Value: []byte("v")})
		time.Sleep(100 * time.Millisecond) // fake time: many polls and ticks
		synctest.Wait()
		if off, ok := src.Committed(tp); ok && off > 0 {
			t.Fatalf("committed %d with the partition paused", off)
		}
		_, body := get(t, h, "/tidemark")
		if !contains(body, `<span class="cause">operator</span>`) || !contains(body, "partition <code>t/0</code>") {
			t.Fatalf("the page does not show the operator's pause:\n%s", body)
		}
		if res := post(h, "/tidemark/resume", url.Values{"topic": {"t"}, "partition": {"0"}}, nil); res.StatusCode != http.StatusOK {
			t.Fatalf("POST resume: %d", res.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if off, ok := src.Committed(tp); !ok || off != 1 {
			t.Fatalf("committed %d (%v) after the resume, want 1", off, ok)
		}
	})
}

// TestPageShowsAPauseAtOnce: the page's form redirects to the page after a
// pause; the page it lands on must show the partition paused by the
// operator, not the stats of before the pause (refreshed every commit
// interval, here an hour). The redirect's Location is relative, so the
// page works under a path prefix.
func TestPageShowsAPauseAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		tp := runner.TP{Topic: "t", Partition: 0}
		r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
			runner.CommitInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		defer func() { r.Close(); <-done }()
		if err := src.Assign(context.Background(), tp); err != nil {
			t.Fatal(err)
		}
		h := status.New(r, status.Controls(true)).Handler()
		res := post(h, "/tidemark/pause", url.Values{"topic": {"t"}, "partition": {"0"}, "from": {"page"}}, nil)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "../tidemark" {
			t.Fatalf("POST pause from the page: %d, Location %q; want 303 to ../tidemark", res.StatusCode, res.Header.Get("Location"))
		}
		_, body := get(t, h, "/tidemark")
		if !contains(body, `action="tidemark/pause"`) || contains(body, `action="/`) {
			t.Errorf("the page's forms do not post to a relative URL:\n%s", body)
		}
		if !contains(body, `<tr class="paused" data-partition="t/0">`) || !contains(body, `<span class="cause">operator</span>`) {
			t.Fatalf("right after the pause the page does not show t/0 paused by the operator:\n%s", body)
		}
		res = post(h, "/tidemark/resume", url.Values{"topic": {"t"}, "partition": {"0"}, "from": {"page"}}, nil)
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("POST resume from the page: %d", res.StatusCode)
		}
		if _, body := get(t, h, "/tidemark"); contains(body, `<tr class="paused"`) {
			t.Fatalf("right after the resume the page still shows t/0 paused:\n%s", body)
		}
	})
}
