package inbox

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

const instrumentation = "github.com/tidemark/tidemark/pkg/inbox"

// telemetry holds the Store's OpenTelemetry instruments (safe for
// concurrent use). Each counter mirrors a field of Stats.
type telemetry struct {
	applied, replays, fenced, retries metric.Int64Counter
	leases, pruned, retaken           metric.Int64Counter
	batchSize                         metric.Int64Histogram // nil unless batching
}

func newTelemetry(mp metric.MeterProvider, batching bool) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation)
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	t := &telemetry{
		applied: counter("tidemark.inbox.applied", "Records whose effect and inbox row committed."),
		replays: counter("tidemark.inbox.replays", "Records whose inbox row already existed (idempotency conflicts): the effect was not run again."),
		fenced:  counter("tidemark.inbox.fenced", "Inbox transactions refused because the partition's lease moved to a newer owner."),
		retries: counter("tidemark.inbox.retries", "Inbox transactions run again after a serialization failure or deadlock."),
		leases:  counter("tidemark.inbox.leases", "Partition lease epochs taken on assignment."),
		pruned:  counter("tidemark.inbox.pruned", "Inbox rows deleted by retention."),
		retaken: counter("tidemark.inbox.retaken", "Partition leases taken back from a late bump of an ended assignment, because the group coordinator said this member owns the partition."),
	}
	if batching {
		h, err := m.Int64Histogram("tidemark.inbox.batch.size", metric.WithDescription("Records per inbox transaction with Batch."))
		errs = append(errs, err)
		t.batchSize = h
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// The count methods add to both the Stats counters and the OpenTelemetry
// ones.

func (s *Store) countApplied(ctx context.Context, n int64) {
	if n > 0 {
		s.stats.applied.Add(n)
		s.tel.applied.Add(ctx, n)
	}
}

func (s *Store) countReplays(ctx context.Context, n int64) {
	if n > 0 {
		s.stats.replays.Add(n)
		s.tel.replays.Add(ctx, n)
	}
}

func (s *Store) countFenced(ctx context.Context) {
	s.stats.fenced.Add(1)
	s.tel.fenced.Add(ctx, 1)
}

func (s *Store) countRetry(ctx context.Context) {
	s.stats.retries.Add(1)
	s.tel.retries.Add(ctx, 1)
}

func (s *Store) countLease(ctx context.Context, loaded int) {
	s.stats.leases.Add(1)
	s.stats.loaded.Add(int64(loaded))
	s.tel.leases.Add(ctx, 1)
}

func (s *Store) countRetaken(ctx context.Context) {
	s.stats.retaken.Add(1)
	s.tel.retaken.Add(ctx, 1)
}

func (s *Store) countPruned(ctx context.Context, n int64) {
	if n > 0 {
		s.stats.pruned.Add(n)
		s.tel.pruned.Add(ctx, n)
	}
}

func (s *Store) countBatch(ctx context.Context, n int) {
	s.stats.batches.Add(1)
	if s.tel.batchSize != nil {
		s.tel.batchSize.Record(ctx, int64(n))
	}
}
