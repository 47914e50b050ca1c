package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

const instrumentation = "github.com/tidemark/tidemark/pkg/inbox"

// telemetry holds the Store's OpenTelemetry instruments (safe for
// concurrent use). Each counter mirrors a field of Stats. Every
// measurement carries the Store's group (messaging.consumer.group.name)
// and the record's topic (messaging.destination.name), the keys of the
// runner's metrics (OpenTelemetry's messaging conventions v1.43.0).
type telemetry struct {
	applied, replays, fenced, retries metric.Int64Counter
	leases, pruned, retaken           metric.Int64Counter
	batchSize                         metric.Int64Histogram // nil unless batching

	group attribute.KeyValue
	// topics holds each topic's measurement options, built at its first
	// measurement: a prebuilt option costs a measurement no allocation.
	mu     sync.RWMutex
	topics map[string]topicOpts
}

type topicOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newTelemetry(mp metric.MeterProvider, group string, batching bool) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(semconv.SchemaURL))
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return c
	}
	t := &telemetry{
		applied: counter("tidemark.inbox.applied", "{record}", "Records whose effect and inbox row committed."),
		replays: counter("tidemark.inbox.replays", "{record}", "Records whose inbox row already existed (idempotency conflicts): the effect was not run again."),
		fenced:  counter("tidemark.inbox.fenced", "{transaction}", "Inbox transactions refused because the partition's lease moved to a newer owner."),
		retries: counter("tidemark.inbox.retries", "{transaction}", "Inbox transactions run again after a serialization failure or deadlock."),
		leases:  counter("tidemark.inbox.leases", "{lease}", "Partition lease epochs taken on assignment."),
		pruned:  counter("tidemark.inbox.pruned", "{row}", "Inbox rows deleted by retention."),
		retaken: counter("tidemark.inbox.retaken", "{lease}", "Partition leases taken back from a late bump of an ended assignment, because the group coordinator said this member owns the partition."),
		group:   semconv.MessagingConsumerGroupName(group),
		topics:  map[string]topicOpts{},
	}
	if batching {
		h, err := m.Int64Histogram("tidemark.inbox.batch.size", metric.WithUnit("{record}"),
			metric.WithDescription("Records per inbox transaction with Batch."))
		if err != nil {
			errs = append(errs, fmt.Errorf("tidemark.inbox.batch.size: %w", err))
		}
		t.batchSize = h
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// of returns topic's measurement options.
func (t *telemetry) of(topic string) topicOpts {
	t.mu.RLock()
	o, ok := t.topics[topic]
	t.mu.RUnlock()
	if ok {
		return o
	}
	a := metric.WithAttributeSet(attribute.NewSet(t.group, semconv.MessagingDestinationName(topic)))
	o = topicOpts{add: []metric.AddOption{a}, rec: []metric.RecordOption{a}}
	t.mu.Lock()
	t.topics[topic] = o
	t.mu.Unlock()
	return o
}

// The count methods add to both the Stats counters and the OpenTelemetry
// ones, for records of topic.

func (s *Store) countApplied(ctx context.Context, topic string, n int64) {
	if n > 0 {
		s.stats.applied.Add(n)
		s.tel.applied.Add(ctx, n, s.tel.of(topic).add...)
	}
}

func (s *Store) countReplays(ctx context.Context, topic string, n int64) {
	if n > 0 {
		s.stats.replays.Add(n)
		s.tel.replays.Add(ctx, n, s.tel.of(topic).add...)
	}
}

func (s *Store) countFenced(ctx context.Context, topic string) {
	s.stats.fenced.Add(1)
	s.tel.fenced.Add(ctx, 1, s.tel.of(topic).add...)
}

func (s *Store) countRetry(ctx context.Context, topic string) {
	s.stats.retries.Add(1)
	s.tel.retries.Add(ctx, 1, s.tel.of(topic).add...)
}

func (s *Store) countLease(ctx context.Context, topic string, loaded int) {
	s.stats.leases.Add(1)
	s.stats.loaded.Add(int64(loaded))
	s.tel.leases.Add(ctx, 1, s.tel.of(topic).add...)
}

func (s *Store) countRetaken(ctx context.Context, topic string) {
	s.stats.retaken.Add(1)
	s.tel.retaken.Add(ctx, 1, s.tel.of(topic).add...)
}

func (s *Store) countPruned(ctx context.Context, topic string, n int64) {
	if n > 0 {
		s.stats.pruned.Add(n)
		s.tel.pruned.Add(ctx, n, s.tel.of(topic).add...)
	}
}

func (s *Store) countBatch(ctx context.Context, topic string, n int) {
	s.stats.batches.Add(1)
	if s.tel.batchSize != nil {
		s.tel.batchSize.Record(ctx, int64(n), s.tel.of(topic).rec...)
	}
}
