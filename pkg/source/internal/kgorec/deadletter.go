package kgorec

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// WriteDeadLetter produces rec's key, value and headers to topic through
// cl and returns once the broker acknowledged the write, or with the
// produce error, prefixed with who (the source's name). A refusal that
// retrying cannot change — the record too large for the broker, the topic
// (max.message.bytes) or the client's ProducerBatchMaxBytes, or invalid —
// is a *runner.RefusedError under it, so the runner writes a smaller dead
// letter instead.
func WriteDeadLetter(ctx context.Context, cl *kgo.Client, who, topic string, rec runner.Record) error {
	r := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value}
	if len(rec.Headers) > 0 {
		r.Headers = make([]kgo.RecordHeader, len(rec.Headers))
		for i, h := range rec.Headers {
			r.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
	}
	err := cl.ProduceSync(ctx, r).FirstErr()
	if err == nil {
		return nil
	}
	if Refused(err) {
		err = &runner.RefusedError{Err: err}
	}
	return fmt.Errorf("%s: dead-letter write of %s to %q: %w", who, rec.String(), topic, err)
}

// Refused reports whether err is a produce error that the same record
// meets on every retry.
func Refused(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage)
}
