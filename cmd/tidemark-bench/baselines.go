package main

// The consumers tidemark is measured against: plain franz-go and kafka-go
// loops, a plain franz-go share-group loop, a goroutine pool, the
// sequential consumer, and the INSERT ceiling of the inbox workload.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/tidemark/tidemark/internal/pgtrace"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// runFranzLoop is the fetch ceiling: a franz-go group consumer that polls
// and does nothing with the records; it commits nothing. It reads
// uncommitted and fetches with franz-go's defaults, unless spec.Fetch
// gives it other fetch settings, which it checks it got.
func runFranzLoop(ctx context.Context, spec childSpec, m *meter) error {
	opts := []kgo.Opt{kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit()}
	if spec.Fetch != nil {
		opts = append(opts, spec.Fetch.opts()...)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if spec.Fetch != nil {
		got := clientFetch(cl)
		if got != *spec.Fetch {
			return fmt.Errorf("the client's fetch settings are %v, not the %v asked for", got, *spec.Fetch)
		}
		m.fetch = &got
	}
	for !m.stopped() {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return err
		}
		n := fs.NumRecords()
		if n == 0 {
			continue
		}
		if !m.live {
			m.startWindow(time.Now())
			m.add(n)
			continue
		}
		fs.EachRecord(func(r *kgo.Record) {
			if m.begin(r.Partition, r.Value) {
				m.add(1)
			}
		})
	}
	return nil
}

// runShareLoop is the share-group fetch ceiling: one franz-go client in
// share group spec.Group that polls up to spec.SharePoll records at a time
// and does nothing with them. It acks nothing itself: franz-go accepts
// every record of a poll at the next poll (its implicit accept) and sends
// the acks with its next ShareFetch. It fetches with franz-go's share
// defaults (ShareMaxRecords 500, not strict, a fetch running ahead of the
// polls), or with spec.ShareStrict as the share source's sessions do (at
// most SharePoll records per fetch, strict, a fetch only while a poll
// runs). Like the share source it sets share.auto.offset.reset=earliest on
// the group before it joins. It marks the offsets it polled (the tracker's
// few nanoseconds a record, which the share source's handler pays too) and,
// gated, holds its first poll's records until the harness says go; it
// counts a poll's records when the poll returns.
func runShareLoop(ctx context.Context, spec childSpec, m *meter) error {
	poll := spec.SharePoll
	if poll <= 0 {
		poll = 512
	}
	// No topics yet: the client joins once it has one, after the group
	// config is set.
	opts := []kgo.Opt{kgo.SeedBrokers(spec.Brokers...), kgo.ShareGroup(spec.Group), kgo.ConsumeTopics()}
	if spec.ShareStrict {
		opts = append(opts, kgo.ShareMaxRecords(int32(poll)), kgo.ShareMaxRecordsStrict())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := setGroupConfig(ctx, cl, spec.Group, "share.auto.offset.reset", "earliest"); err != nil {
		return err
	}
	cl.AddConsumeTopics(spec.Topic)
	for !m.stopped() {
		fs := cl.PollRecords(ctx, poll)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A share fetch's errors are the broker's or the connection's;
		// franz-go retries them, as the share source lets it.
		n := fs.NumRecords()
		if n == 0 {
			continue
		}
		m.gate(ctx)
		if !m.started.Load() {
			m.startWindow(time.Now())
		}
		if m.offsets != nil {
			fs.EachRecord(func(r *kgo.Record) { m.finished(r.Partition, r.Offset, r.DeliveryCount()) })
		}
		m.add(n)
	}
	return nil
}

// setGroupConfig sets config name to value on group's GROUP resource
// (IncrementalAlterConfigs), as share.GroupConfig does.
func setGroupConfig(ctx context.Context, cl *kgo.Client, group, name, value string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = name, &value, kmsg.IncrementalAlterConfigOpSet
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("setting %s of group %s: %w", name, group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return fmt.Errorf("setting %s of group %s: %w%s", name, group, err, msg)
		}
	}
	return nil
}

// runFranzPool is the least a parallel consumer does: a franz-go poll loop
// sends each record over a channel to Concurrency goroutines, which run the
// handler body and send the record back over a second channel to one
// goroutine that takes the completions, as anything tracking what it may
// commit must. No ordering, no offset tracking, no commits, no flow
// control: it is the floor under tidemark's dispatch, not a usable
// consumer. It counts records in the handler goroutines as tidemark's
// handler does.
func runFranzPool(ctx context.Context, spec childSpec, m *meter) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	conc := max(spec.Concurrency, 1)
	recs, done := make(chan *kgo.Record, conc), make(chan *kgo.Record, conc)
	body := work(spec)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range recs {
				counts := m.begin(r.Partition, r.Value)
				if body != nil {
					body(ctx)
				}
				if counts {
					m.add(1)
				}
				done <- r
			}
		}()
	}
	completed := make(chan struct{})
	go func() {
		defer close(completed)
		for range done {
		}
	}()
	defer func() {
		close(recs)
		wg.Wait()
		close(done)
		<-completed
	}()
	// The last record is counted by a pool goroutine while the loop may be
	// waiting for more: end the poll then.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-pctx.Done():
		}
	}()
	for !m.stopped() {
		fs := cl.PollFetches(pctx)
		if m.stopped() {
			return nil
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		for it := fs.RecordIter(); !it.Done(); {
			select {
			case recs <- it.Next():
			case <-m.done:
				return nil
			}
		}
	}
	return nil
}

// runReaderLoop is what a kafka-go user writes: a consumer-group Reader,
// FetchMessage and CommitMessages per message, commits sent asynchronously
// once a second (CommitInterval, as tidemark's CommitInterval default), and
// the fetch settings of tidemark's kafkago adapter.
func runReaderLoop(ctx context.Context, spec childSpec, m *meter) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        spec.Brokers,
		GroupID:        spec.Group,
		Topic:          spec.Topic,
		MinBytes:       1,
		MaxBytes:       1 << 20,
		MaxWait:        500 * time.Millisecond,
		StartOffset:    kafka.FirstOffset,
		CommitInterval: time.Second,
	})
	defer r.Close()
	for !m.stopped() {
		msg, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if m.begin(int32(msg.Partition), msg.Value) {
			m.add(1)
		}
		if err := r.CommitMessages(ctx, msg); err != nil {
			return err
		}
	}
	return nil
}

// runSequential is what many services do today: one record at a time,
// handled in the poll loop, offsets committed after each poll.
func runSequential(ctx context.Context, spec childSpec, m *meter) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	h := work(spec)
	for !m.stopped() {
		fs := cl.PollRecords(ctx, 500)
		if err := fs.Err0(); err != nil {
			return err
		}
		for it := fs.RecordIter(); !it.Done() && !m.stopped(); {
			rec := it.Next()
			counts := m.begin(rec.Partition, rec.Value)
			if h != nil {
				h(ctx)
			}
			if counts {
				m.add(1)
			}
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return err
		}
	}
	return nil
}

// runInsertLoop is the inbox's ceiling: spec.Records single-row INSERTs,
// each its own transaction (autocommit), from poolConns connections at
// once, the row shaped like the inbox workload's effect.
func runInsertLoop(ctx context.Context, spec childSpec, m *meter) error {
	m.rt = &pgtrace.RoundTrips{}
	pool, err := openTracedPool(ctx, spec.DSN, spec.Schema, m.rt)
	if err != nil {
		return err
	}
	defer pool.Close()
	value := make([]byte, spec.Size)
	var next atomic.Int64
	errs := make(chan error, poolConns)
	var wg sync.WaitGroup
	for w := range poolConns {
		wg.Go(func() {
			key := []byte(fmt.Sprintf("key-%d", w))
			for i := next.Add(1); i <= int64(spec.Records); i = next.Add(1) {
				m.begin(0, nil)
				if _, err := pool.Exec(ctx, effectSQL, "ceiling", int32(i%12), i, key, value); err != nil {
					errs <- err
					return
				}
				m.add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
