package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// cpuMeter measures what the machine's load disturbs less than the wall
// time, for the records a benchmark runs: the process's CPU time (user and
// system, all goroutines, the collector's included), the time the
// collector took (runtime/metrics' estimate: its share of the Ps' time)
// and the collections. Start it after b.ResetTimer, report before
// b.StopTimer.
type cpuMeter struct {
	cpu     time.Duration
	cpuOK   bool
	samples [2]metrics.Sample
}

func startCPU() *cpuMeter {
	m := &cpuMeter{}
	m.samples[0].Name, m.samples[1].Name = "/cpu/classes/gc/total:cpu-seconds", "/gc/cycles/total:gc-cycles"
	metrics.Read(m.samples[:])
	m.cpu, m.cpuOK = processCPU()
	return m
}

// report adds cpu-ns/op, gc-ns/op and gcs/Mop (collections per million
// records) to b's results.
func (m *cpuMeter) report(b *testing.B) {
	cpu, ok := processCPU()
	end := m.samples
	metrics.Read(end[:])
	n := float64(b.N)
	if ok && m.cpuOK {
		b.ReportMetric(float64(cpu-m.cpu)/n, "cpu-ns/op")
	}
	b.ReportMetric((end[0].Value.Float64()-m.samples[0].Value.Float64())*1e9/n, "gc-ns/op")
	b.ReportMetric(float64(end[1].Value.Uint64()-m.samples[1].Value.Uint64())*1e6/n, "gcs/Mop")
}

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
	cpu := startCPU()
	if err := src.Assign(context.Background(), tps...); err != nil {
		b.Fatal(err)
	}
	<-all
	cpu.report(b)
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
	cpu := startCPU()
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
	cpu.report(b)
	b.StopTimer()
	wg.Wait()
}

// BenchmarkDeliver measures what the poll goroutine spends per record to
// take a hand-over in (track it, copy its bytes, make its task, queue it)
// and to finish it, with no worker and no source between: one op is one
// batch of 100 records of one partition, delivered and completed. The
// baseline beside it is the least a copy of the same bytes costs, one
// allocation per record.
func BenchmarkDeliver(b *testing.B) {
	const perBatch = 100
	for _, size := range []int{10, 100, 1000} {
		keys := make([][]byte, perBatch)
		for i := range keys {
			keys[i] = []byte(fmt.Sprintf("key-%d", i))
		}
		val := make([]byte, size)
		b.Run(fmt.Sprintf("tidemark/value=%d", size), func(b *testing.B) {
			r, err := runner.New(newDriver(), runner.Handle(topic, func(ctx context.Context, rec runner.Record) error { return nil }),
				runner.Order(runner.Unordered), runner.Logger(slog.New(slog.DiscardHandler)))
			if err != nil {
				b.Fatal(err)
			}
			runner.AssignForTest(r, []runner.TP{tp(0)})
			recs := make([]runner.Record, perBatch)
			var off int64
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				for i := range recs {
					recs[i] = runner.Record{Topic: topic, Offset: off, Key: keys[i], Value: val}
					off++
				}
				runner.DeliverForTest(r, batch(recs))
				if n := runner.CompleteForTest(r, perBatch, func(runner.Record) bool { return false }); n != perBatch {
					b.Fatalf("completed %d of %d", n, perBatch)
				}
			}
			cpu.report(b)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perBatch), "ns/record")
		})
		b.Run(fmt.Sprintf("baseline-copy/value=%d", size), func(b *testing.B) {
			keep := make([][]byte, perBatch)
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				for i := range keep {
					c := make([]byte, len(keys[i])+len(val))
					copy(c[copy(c, keys[i]):], val)
					keep[i] = c
				}
			}
			cpu.report(b)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perBatch), "ns/record")
		})
	}
}
