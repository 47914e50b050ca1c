//go:build integration

package integration_test

import (
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
	"github.com/tidemark/tidemark/pkg/source/share"
	"github.com/tidemark/tidemark/pkg/source/sourcetest"
)

// adapters returns the conformance suite's factory of each adapter on
// brokers, by name, with each adapter's capabilities declared.
func adapters(brokers []string) map[string]sourcetest.Factory {
	return map[string]sourcetest.Factory{
		"franz": {
			Brokers:      brokers,
			Capabilities: sourcetest.Capabilities{Cooperative: true, StaticMembership: true},
			New: func(c sourcetest.Config) (runner.Source, error) {
				opts := []franz.Option{
					franz.SessionTimeout(c.SessionTimeout),
					franz.RebalanceTimeout(c.RebalanceTimeout),
					franz.HeartbeatInterval(c.HeartbeatInterval),
					franz.Logger(c.Logger),
				}
				if c.InstanceID != "" {
					opts = append(opts, franz.InstanceID(c.InstanceID))
				}
				return franz.New(c.Brokers, c.Group, c.Topics, opts...)
			},
		},
		"kafkago": {
			Brokers: brokers,
			// Eager rebalances only, no static membership: kafka-go's
			// ConsumerGroup offers neither (see pkg/source/kafkago).
			Capabilities: sourcetest.Capabilities{},
			New: func(c sourcetest.Config) (runner.Source, error) {
				return kafkago.New(c.Brokers, c.Group, c.Topics,
					kafkago.SessionTimeout(c.SessionTimeout),
					kafkago.RebalanceTimeout(c.RebalanceTimeout),
					kafkago.HeartbeatInterval(c.HeartbeatInterval),
					kafkago.Logger(c.Logger),
				)
			},
		},
		"share": {
			Brokers: brokers,
			// A share group: no commits, no revokes, no partition owner;
			// the suite runs the scenarios whose promises it makes.
			Capabilities: sourcetest.Capabilities{Share: true},
			New: func(c sourcetest.Config) (runner.Source, error) {
				return share.New(c.Brokers, c.Group, c.Topics,
					share.GroupConfig("share.auto.offset.reset", "earliest"),
					// Kafka's default is 30s, the bed's 5s (for the tests
					// of lock expiry). The scenarios want every record
					// handled once, which a lock running out under a
					// record breaks by design: on a loaded machine the
					// broker can answer a renewal later than a third of
					// 5s. 15s keeps the renewals well inside the lock.
					share.GroupConfig("share.record.lock.duration.ms", "15000"),
					share.Logger(c.Logger),
				)
			},
		},
	}
}

// TestConformance runs the source conformance suite (pkg/source/sourcetest)
// against every adapter on the test bed's broker, side by side: the same
// scenarios, with each adapter's capabilities declared and checked.
func TestConformance(t *testing.T) {
	t.Parallel()
	for name, f := range adapters(bed.Kafka(t)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sourcetest.Run(t, f)
		})
	}
}

// TestRebalanceStorm runs the suite's storm scenario at ten times the size
// TestConformance runs it, for both group adapters: 200,000 keyed records (5,000
// keys) over 12 partitions, produced in eight chunks, and members of 64
// handlers of up to 5ms each, one joining or leaving after each chunk (1.4
// to 2.4 seconds apart) and on until every record is handled.
// sourcetest.RunStorm lists what it checks.
func TestRebalanceStorm(t *testing.T) {
	t.Parallel()
	size := sourcetest.Storm{Records: 200_000, Partitions: 12, Keys: 5_000, Steps: 8, Every: 2 * time.Second,
		Concurrency: 64, Latency: 5 * time.Millisecond, Within: 4 * time.Minute}
	// One adapter at a time: two storms of 200 handlers each starve each
	// other of the CPU, and a storm whose members barely consume churns
	// for minutes. make test runs it without -race, with the other volume
	// tests (docs/testbed.md); TestConformance's storm, a tenth of it,
	// runs under -race.
	for name, f := range adapters(bed.Kafka(t)) {
		if f.Capabilities.Share {
			// RunStorm is the group storm (committed offsets, key
			// order); the share storm runs in TestConformance.
			continue
		}
		t.Run(name, func(t *testing.T) { sourcetest.RunStorm(t, f, size) })
	}
}
