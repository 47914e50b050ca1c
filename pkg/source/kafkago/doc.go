// Package kafkago is tidemark's source adapter over
// github.com/segmentio/kafka-go's ConsumerGroup API. kafka-go supports eager
// rebalances only, without static membership or pause.
//
// Not built yet: see the project's issue on the kafka-go adapter.
package kafkago
