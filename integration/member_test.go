//go:build integration

package integration_test

// The harness of the broker tests that run whole members: a franz Source
// with the tests' timeouts, a runner over any Source started and stopped
// with the test (kafkatest.Member), and a goroutine leak check after each
// test.

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// noLeaks fails the test if a goroutine it started is still alive once
// every cleanup has run (it is registered first, so its cleanup runs last:
// after the members, clients, pools and topics are gone).
//
// The test's goroutine gets a pprof label of its own, which every goroutine
// it starts inherits, and those inherit in turn; the check looks only for
// goroutines carrying that label. So it holds for tests that run in
// parallel, where a check of every goroutine in the process (goleak.Find)
// would see the other tests' members. What it cannot see is a goroutine the
// runtime starts with no creator (a time.AfterFunc callback's).
func noLeaks(t leakTB) {
	t.Helper()
	id := strconv.FormatInt(leakSeq.Add(1), 10)
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(leakLabel, id)))
	t.Cleanup(func() {
		defer pprof.SetGoroutineLabels(context.Background())
		// Goroutines end a little after the Close that stops them:
		// look again for a while, as goleak does.
		deadline := time.Now().Add(leakGrace)
		for {
			left := labelled(id)
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines outlived the test:\n%s", strings.Join(left, "\n\n"))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// leakTB is the part of testing.TB that noLeaks uses.
type leakTB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
}

// leakLabel is the pprof label noLeaks gives a test's goroutines; leakSeq
// numbers the tests; leakGrace is how long a goroutine may take to end
// (seconds on a loaded machine: a goroutine that a Close started, such as
// franz-go's context.AfterFunc callbacks, waits for a CPU among those of
// the tests running beside it, under -race).
const (
	leakLabel = "tidemark-test"
	leakGrace = 10 * time.Second
)

var leakSeq atomic.Int64

// labelled returns the stacks of the goroutines labelled id, but the
// caller's, from the goroutine profile (debug=1: one block per distinct
// stack and label set, the labels on a "# labels:" line).
func labelled(id string) []string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1) // a strings.Builder never fails
	want := fmt.Sprintf("%q:%q", leakLabel, id)
	var left []string
	for _, block := range strings.Split(b.String(), "\n\n") {
		i := strings.Index(block, "# labels: {")
		if i < 0 || strings.Contains(block, "runtime/pprof.writeGoroutine") {
			continue
		}
		labels := block[i:]
		labels = labels[:strings.IndexByte(labels, '\n')+1]
		if strings.Contains(labels, want+",") || strings.Contains(labels, want+"}") {
			left = append(left, block)
		}
	}
	return left
}

// franzSource returns a franz Source on the test bed with the integration
// tests' usual timeouts; opts come after them.
func franzSource(t *testing.T, group, topic string, opts ...franz.Option) *franz.Source {
	t.Helper()
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, append([]franz.Option{
		franz.SessionTimeout(10 * time.Second), franz.RebalanceTimeout(20 * time.Second),
		franz.HeartbeatInterval(500 * time.Millisecond), franz.Logger(kafkatest.Logger(t)),
	}, opts...)...)
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	return src
}

// runMember runs a runner over src with h for topic, a 100ms commit
// interval and a 5s drain budget (opts come after them). It is shut down
// within 20s in the test's cleanup unless the test stopped it. A spySource
// is run with the optional interfaces of the Source it wraps (fetch
// limits, dead letters), as without the spy.
func runMember(t *testing.T, name string, src runner.Source, topic string, h runner.Handler, opts ...runner.Option) *kafkatest.Member {
	t.Helper()
	run := src
	if sp, ok := src.(*spySource); ok {
		run = kafkatest.WithOptional(sp, sp.Source)
	}
	return kafkatest.Start(t, name, run, 20*time.Second, append([]runner.Option{runner.Handle(topic, h), runner.Logger(kafkatest.Logger(t)),
		runner.CommitInterval(100 * time.Millisecond), runner.DrainBudget(5 * time.Second)}, opts...)...)
}

// startMember runs a member over a franzSource in group with a 200ms
// commit interval; see runMember.
func startMember(t *testing.T, name, group, topic string, h runner.Handler, opts ...runner.Option) *kafkatest.Member {
	t.Helper()
	return runMember(t, name, franzSource(t, group, topic), topic, h, append([]runner.Option{runner.CommitInterval(200 * time.Millisecond)}, opts...)...)
}

// leakRecorder is a leakTB whose cleanups run when the test says.
type leakRecorder struct {
	cleanups []func()
	errs     []string
}

func (r *leakRecorder) Helper()          {}
func (r *leakRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *leakRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestNoLeaksSeesOnlyItsOwnGoroutines: the check reports a goroutine its
// test started (also one started by such a goroutine), and none of another
// test's, started before or during it, with noLeaks or without.
func TestNoLeaksSeesOnlyItsOwnGoroutines(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	defer close(stop)
	wait := func() { <-stop }
	// Another test: a goroutine of its own with its own label, and one
	// without a label, as a test without the check has.
	var other leakRecorder
	started := make(chan struct{})
	go func() {
		noLeaks(&other)
		go wait()
		close(started)
		wait()
	}()
	<-started
	go wait()
	for _, leak := range []bool{false, true} {
		var rec leakRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			noLeaks(&rec)
			ended := make(chan struct{})
			go func() { close(ended) }() // ends: not a leak
			<-ended
			if leak {
				go func() { go wait() }() // a grandchild that stays
			}
			for _, f := range rec.cleanups {
				f()
			}
		}()
		<-done
		switch {
		case leak && (len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "member_test.go")):
			t.Errorf("a leaked goroutine: the check reported %q, want one report with its stack", rec.errs)
		case !leak && len(rec.errs) != 0:
			t.Errorf("no goroutine leaked, but the check reported %q", rec.errs)
		}
	}
}
