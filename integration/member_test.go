//go:build integration

package integration_test

// The harness of the broker tests that run whole members: a franz Source
// with the tests' timeouts, a runner started and stopped with the test, a
// goroutine leak check after each test, and a poll for a condition.

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// gapNoLeaks fails the test if a goroutine started during it is still
// alive once every cleanup has run (it is registered first, so its cleanup
// runs last: after the members, clients, pools and topics are gone).
func gapNoLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(opt); err != nil {
			t.Errorf("goroutines outlived the test: %v", err)
		}
	})
}

// gapFranz returns a franz Source on the test bed with the integration
// tests' usual timeouts; opts come after them.
func gapFranz(t *testing.T, group, topic string, opts ...franz.Option) *franz.Source {
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

// gapMember is one runner over any Source. It is stopped gracefully in the
// test's cleanup unless the test stopped it.
type gapMember struct {
	name string
	r    *runner.Runner
	done chan error
	once sync.Once
}

func gapStart(t *testing.T, name string, src runner.Source, topic string, h runner.Handler, opts ...runner.Option) *gapMember {
	t.Helper()
	run := src
	if sp, ok := src.(*spySource); ok {
		run = kafkatest.WithOptional(sp, sp.Source) // the adapter's fetch limits and dead letters, as without the spy
	}
	r, err := runner.New(run, append([]runner.Option{runner.Handle(topic, h), runner.Logger(kafkatest.Logger(t)),
		runner.CommitInterval(100 * time.Millisecond), runner.DrainBudget(5 * time.Second)}, opts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	m := &gapMember{name: name, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop shuts the member down within 20 s and reports an error from
// Shutdown or Run; later calls do nothing.
func (m *gapMember) stop(t *testing.T) {
	t.Helper()
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.r.Shutdown(ctx); err != nil {
			t.Errorf("member %s: Shutdown: %v", m.name, err)
		}
		if err := <-m.done; err != nil {
			t.Errorf("member %s: Run: %v", m.name, err)
		}
	})
}

// gapWait polls cond every 20 ms and fails the test after within.
func gapWait(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
