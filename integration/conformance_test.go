//go:build integration

package integration_test

import (
	"testing"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
	"github.com/tidemark/tidemark/pkg/source/sourcetest"
)

// TestConformance runs the source conformance suite (pkg/source/sourcetest)
// against both adapters on the test bed's broker, side by side: the same
// scenarios, with each adapter's capabilities declared and checked.
func TestConformance(t *testing.T) {
	brokers := bed.Kafka(t)
	t.Run("franz", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, sourcetest.Factory{
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
		})
	})
	t.Run("kafkago", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, sourcetest.Factory{
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
		})
	})
}
