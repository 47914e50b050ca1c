// Package kgorec converts franz-go's records into the runner's, for the two
// sources over kgo (franz and share).
package kgorec

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Record converts r. Key, value and header bytes are shared with r: the
// runner copies the bytes it keeps. DeliveryCount is left to the share
// source, so the group source does not pay the context lookup per record.
func Record(r *kgo.Record) runner.Record {
	rec := runner.Record{
		Topic:       r.Topic,
		Partition:   r.Partition,
		Offset:      r.Offset,
		Key:         r.Key,
		Value:       r.Value,
		Timestamp:   r.Timestamp,
		LeaderEpoch: r.LeaderEpoch,
	}
	if len(r.Headers) > 0 {
		rec.Headers = make([]runner.Header, len(r.Headers))
		for i, h := range r.Headers {
			rec.Headers[i] = runner.Header{Key: h.Key, Value: h.Value}
		}
	}
	return rec
}
