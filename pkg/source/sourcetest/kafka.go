package sourcetest

import "github.com/tidemark/tidemark/pkg/runner"

// The scenarios watch the broker through internal/kafkatest's Cluster, a
// franz-go client whatever the adapter under test, so the adapter is never
// its own witness.

// tpOf names partition p of topic.
func tpOf(topic string, p int32) runner.TP { return runner.TP{Topic: topic, Partition: p} }
