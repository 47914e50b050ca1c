package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// BenchmarkOverhead measures the framework's cost per record with an
// in-memory source and a no-op handler: dispatch into lanes, the worker
// handoff, completion, watermark tracking and commits. One op is one record
// (the pipeline runs b.N records end to end, so this uses b.N rather than
// b.Loop). The baseline beside it is the least a parallel consumer can do:
// each record sent on a channel to a pool of goroutines and its completion
// sent back, with no ordering, tracking or commits.
func BenchmarkOverhead(b *testing.B) {
	for _, conc := range []int{1, 64} {
		for _, mode := range []runner.Ordering{runner.KeyOrder, runner.PartitionOrder, runner.Unordered} {
			b.Run(fmt.Sprintf("tidemark/%s/concurrency=%d", mode, conc), func(b *testing.B) {
				benchRunner(b, conc, mode)
			})
		}
		b.Run(fmt.Sprintf("baseline-chan/concurrency=%d", conc), func(b *testing.B) {
			benchChannels(b, conc)
		})
	}
}

const benchPartitions, benchKeys = 12, 10000

func benchRecords(n int) [][]runner.Record {
	parts := make([][]runner.Record, benchPartitions)
	for i := range n {
		p := i % benchPartitions
		parts[p] = append(parts[p], runner.Record{
			Topic: topic, Partition: int32(p), Offset: int64(len(parts[p])),
			Key: []byte(fmt.Sprintf("key-%d", i%benchKeys)), Value: make([]byte, 100),
		})
	}
	return parts
}

func benchRunner(b *testing.B, conc int, mode runner.Ordering) {
	parts := benchRecords(b.N)
	src := runnertest.New()
	src.BatchSize = 500
	for _, recs := range parts {
		src.Append(recs...)
	}
	var handled atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	}), runner.Concurrency(conc), runner.Order(mode), runner.WaterMarks(20000, 10000),
		runner.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	tps := make([]runner.TP, benchPartitions)
	for p := range tps {
		tps[p] = tp(int32(p))
	}
	b.ReportAllocs()
	b.ResetTimer()
	if err := src.Assign(context.Background(), tps...); err != nil {
		b.Fatal(err)
	}
	<-all
	b.StopTimer()
	if err := r.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	for _, t := range tps {
		if off, _ := src.Committed(t); off != int64(len(parts[t.Partition])) {
			b.Fatalf("%s committed %d, want %d", t, off, len(parts[t.Partition]))
		}
	}
}

func benchChannels(b *testing.B, conc int) {
	parts := benchRecords(b.N)
	work := make(chan *runner.Record, conc)
	done := make(chan *runner.Record, conc)
	h := func(ctx context.Context, rec runner.Record) error { return nil }
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec := range work {
				_ = h(context.Background(), *rec)
				done <- rec
			}
		}()
	}
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for i := range b.N {
			p := parts[i%benchPartitions]
			work <- &p[i/benchPartitions]
		}
		close(work)
	}()
	for range b.N {
		<-done
	}
	b.StopTimer()
	wg.Wait()
}
