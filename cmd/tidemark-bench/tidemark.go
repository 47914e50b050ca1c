package main

// The tidemark consumer of a child: the adapter and the runner as spec
// asks, with the no-op, sleep, CPU or inbox handler.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/pgtrace"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// newSource returns the adapter spec.Adapter over spec's topic and group,
// as tidemark's child runs it.
func newSource(spec childSpec, log *slog.Logger) (runner.Source, error) {
	switch spec.Adapter {
	case "franz":
		fopts := []franz.Option{franz.Logger(log)}
		if spec.PartBytes > 0 {
			fopts = append(fopts, franz.ClientOptions(kgo.FetchMaxPartitionBytes(int32(spec.PartBytes))))
		}
		return franz.New(spec.Brokers, spec.Group, []string{spec.Topic}, fopts...)
	case "kafkago":
		return kafkago.New(spec.Brokers, spec.Group, []string{spec.Topic}, kafkago.Logger(log))
	case "share":
		sopts := []share.Option{share.Logger(log), share.GroupConfig("share.auto.offset.reset", "earliest")}
		if spec.ShareSessions > 0 {
			sopts = append(sopts, share.Sessions(spec.ShareSessions))
		}
		if spec.SharePoll > 0 {
			sopts = append(sopts, share.MaxPollRecords(spec.SharePoll))
		}
		return share.New(spec.Brokers, spec.Group, []string{spec.Topic}, sopts...)
	}
	return nil, fmt.Errorf("unknown adapter %q", spec.Adapter)
}

// runnerOptions returns the runner's options of spec, the handler aside.
func runnerOptions(spec childSpec, log *slog.Logger) ([]runner.Option, error) {
	order, err := parseOrder(spec.Order)
	if err != nil {
		return nil, err
	}
	opts := []runner.Option{runner.Concurrency(max(spec.Concurrency, 1)), runner.Order(order), runner.Logger(log)}
	if spec.High > 0 {
		opts = append(opts, runner.WaterMarks(spec.High, spec.High/2))
	}
	if spec.Adapter == "share" {
		// The default policy, Block, is refused over a share source; the
		// bench's handlers do not fail.
		opts = append(opts, runner.Failure(runner.Skip(3)))
	}
	return opts, nil
}

// adapterFetch returns the fetch settings tidemark's franz adapter runs
// with under spec: it builds the adapter and the runner as runTidemark does
// (runner.New makes the adapter derive its fetch sizes from the memory
// bound, runner.FetchLimiter) and reads them back from the adapter's
// client, then closes it. Nothing is sent to a broker. log is the
// adapter's and the runner's logger.
func adapterFetch(spec childSpec, log *slog.Logger) (fetchSettings, error) {
	if spec.Adapter != "franz" {
		return fetchSettings{}, fmt.Errorf("fetch settings of adapter %q: only franz has franz-go's", spec.Adapter)
	}
	src, err := newSource(spec, log)
	if err != nil {
		return fetchSettings{}, err
	}
	defer src.Close()
	opts, err := runnerOptions(spec, log)
	if err != nil {
		return fetchSettings{}, err
	}
	noop := func(context.Context, runner.Record) error { return nil }
	if _, err := runner.New(src, append(opts, runner.Handle(spec.Topic, noop))...); err != nil {
		return fetchSettings{}, err
	}
	return clientFetch(src.(*franz.Source).Client()), nil
}

// runTidemark runs the runner over spec.Adapter until the meter stops, then
// shuts it down gracefully.
func runTidemark(ctx context.Context, spec childSpec, m *meter) error {
	quiet := quietLogger()
	src, err := newSource(spec, quiet)
	if err != nil {
		return err
	}
	opts, err := runnerOptions(spec, quiet)
	if err != nil {
		return err
	}
	var h runner.Handler
	if spec.Handler == "inbox" {
		m.rt = &pgtrace.RoundTrips{}
		pool, err := openTracedPool(ctx, spec.DSN, spec.Schema, m.rt)
		if err != nil {
			return err
		}
		defer pool.Close()
		iopts := []inbox.Option{inbox.Logger(quiet)}
		if spec.Batch > 1 {
			iopts = append(iopts, inbox.Batch(spec.Batch))
			if spec.BatchWait > 0 {
				iopts = append(iopts, inbox.BatchWait(spec.BatchWait))
			}
		}
		store, err := inbox.New(pool, spec.Group, iopts...)
		if err != nil {
			return err
		}
		defer func() {
			if st := store.Stats(); st.Batches > 0 {
				m.perTx = float64(st.Applied) / float64(st.Batches)
			}
		}()
		apply := store.Handler(insertEffect)
		if spec.Queued {
			apply = store.QueuedHandler(insertQueued)
		}
		h = func(ctx context.Context, rec runner.Record) error {
			counts := m.begin(rec.Partition, rec.Value)
			if err := apply(ctx, rec); err != nil {
				return err
			}
			if counts {
				m.add(1)
			}
			return nil
		}
		opts = append(opts, runner.OnAssign(store.AssignHook()))
	} else {
		body := work(spec)
		h = func(ctx context.Context, rec runner.Record) error {
			m.gate(ctx)
			counts := m.begin(rec.Partition, rec.Value)
			if body != nil {
				body(ctx)
			}
			m.finished(rec.Partition, rec.Offset, rec.DeliveryCount)
			if counts {
				m.add(1)
			}
			return nil
		}
	}
	r, err := runner.New(src, append(opts, runner.Handle(spec.Topic, h))...)
	if err != nil {
		return err
	}
	if fs, ok := src.(*franz.Source); ok {
		// Before Run and after it the client is not fetching: its
		// settings can be read (see clientFetch).
		f := clientFetch(fs.Client())
		m.fetch = &f
		defer func() {
			f := clientFetch(fs.Client())
			m.fetchEnd = &f
		}()
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-m.done:
	case err := <-done:
		return fmt.Errorf("runner stopped early: %v", err)
	case <-ctx.Done():
		err = fmt.Errorf("handled %d records, wanted %d, in %v: %w", m.count.Load(), m.limit, spec.Timeout, ctx.Err())
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if serr := r.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	return err
}
