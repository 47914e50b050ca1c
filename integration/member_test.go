//go:build integration

package integration_test

// The harness of the broker tests that run whole members: a franz Source
// with the tests' timeouts, a runner over any Source started and stopped
// with the test (kafkatest.Member), and a goroutine leak check after each
// test.

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// noLeaks fails the test if a goroutine started during it is still alive
// once every cleanup has run (it is registered first, so its cleanup runs
// last: after the members, clients, pools and topics are gone).
func noLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(opt); err != nil {
			t.Errorf("goroutines outlived the test: %v", err)
		}
	})
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
