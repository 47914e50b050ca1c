package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tidemark/tidemark/pkg/runner"
)

// BenchmarkPipeline measures the runner's own cost per record end to end,
// like BenchmarkOverhead, but over a generating source that builds each
// poll's records in a reused buffer from a fixed key table, as a Kafka
// client does from its fetch buffers. BenchmarkOverhead holds all b.N
// records in memory before it starts, so its numbers include the garbage
// collector scanning that input; this one's heap is the runner's own. Its
// numbers are bimodal in key order (about 200 or about 600 ns/op on the
// 2-core test machine): once a backlog up to the high water marks builds,
// the 120,000 buffered tasks no longer fit in the caches, and every lane
// hand-off misses. Compare runs with -count, not single ones. Telemetry
// is off (no provider installed): the docs/performance.md promise of no
// allocation per record for it is measured here and in
// TestRecordTelemetryAllocatesNothingWhenTracingIsOff.
func BenchmarkPipeline(b *testing.B) {
	for _, mode := range []runner.Ordering{runner.KeyOrder, runner.PartitionOrder, runner.Unordered} {
		b.Run(fmt.Sprintf("%s/concurrency=64", mode), func(b *testing.B) {
			var handled atomic.Int64
			all := make(chan struct{})
			n := int64(b.N)
			h := func(ctx context.Context, rec runner.Record) error {
				if handled.Add(1) == n {
					close(all)
				}
				return nil
			}
			src := newGenSource(b.N)
			r, err := runner.New(src, runner.Handle(topic, h), runner.Concurrency(64), runner.Order(mode),
				runner.WaterMarks(10000, 5000), runner.Logger(slog.New(slog.DiscardHandler)))
			if err != nil {
				b.Fatal(err)
			}
			timeRun(b, r, all)
			if got := src.committedTotal(); got != int64(b.N) {
				b.Fatalf("committed %d records, want %d", got, b.N)
			}
		})
	}
}

// BenchmarkPipelineTraced is BenchmarkPipeline's key order with tracing
// on: an SDK tracer provider sampling every span, with no exporter, so
// that what it measures is the runner's span per record (its attributes,
// its context) and the SDK's span, not an export. With a batching
// exporter the export's cost comes on top.
func BenchmarkPipelineTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	var handled atomic.Int64
	all := make(chan struct{})
	n := int64(b.N)
	h := func(ctx context.Context, rec runner.Record) error {
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	}
	src := newGenSource(b.N)
	r, err := runner.New(src, runner.Handle(topic, h), runner.Concurrency(64), runner.TracerProvider(tp),
		runner.WaterMarks(10000, 5000), runner.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	timeRun(b, r, all)
	if got := src.committedTotal(); got != int64(b.N) {
		b.Fatalf("committed %d records, want %d", got, b.N)
	}
}

// timeRun runs r and times it, with its CPU, until all is closed (the
// last record handled); then it shuts r down and fails b unless Run and
// Shutdown both return nil.
func timeRun(b *testing.B, r *runner.Runner, all <-chan struct{}) {
	b.Helper()
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	go func() { done <- r.Run(context.Background()) }()
	<-all
	cpu.report(b)
	b.StopTimer()
	if err := r.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// genSource is a runner.Source generating n records over benchPartitions
// partitions, one partition per poll in turn, honouring the runner's budget
// and pauses.
type genSource struct {
	n    int
	keys [][]byte
	val  []byte

	mu        sync.Mutex
	paused    map[int32]bool
	committed map[int32]int64
	resumed   chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newGenSource(n int) *genSource {
	g := &genSource{n: n, val: make([]byte, 100), paused: map[int32]bool{}, committed: map[int32]int64{},
		resumed: make(chan struct{}, 1), closed: make(chan struct{})}
	for k := range benchKeys {
		g.keys = append(g.keys, []byte(fmt.Sprintf("key-%d", k)))
	}
	return g
}

func (g *genSource) Run(ctx context.Context, sink runner.Sink) error {
	as := make([]runner.Assignment, benchPartitions)
	for p := range as {
		as[p] = runner.Assignment{TP: tp(int32(p)), Start: 0, Generation: runner.NoGeneration}
	}
	if err := sink.Assigned(ctx, as); err != nil {
		return nil
	}
	next := make([]int64, benchPartitions)
	buf := make([]runner.Record, 0, 500)
	budget, err := sink.Fetched(ctx, nil)
	if err != nil {
		return nil
	}
	sent, p := 0, 0
	for sent < g.n {
		// The next unpaused partition, or wait for a resume.
		g.mu.Lock()
		found := false
		for range benchPartitions {
			p = (p + 1) % benchPartitions
			if !g.paused[int32(p)] {
				found = true
				break
			}
		}
		g.mu.Unlock()
		if !found {
			select {
			case <-g.resumed:
				continue
			case <-ctx.Done():
				return nil
			case <-g.closed:
				return nil
			}
		}
		m := min(budget, cap(buf), g.n-sent)
		buf = buf[:m]
		for i := range buf {
			off := next[p]
			buf[i] = runner.Record{Topic: topic, Partition: int32(p), Offset: off,
				Key: g.keys[(off*benchPartitions+int64(p))%benchKeys], Value: g.val}
			next[p]++
		}
		sent += m
		budget, err = sink.Fetched(ctx, []runner.Batch{{TP: tp(int32(p)), Records: buf, Position: -1, HighWatermark: -1}})
		if err != nil {
			return nil
		}
	}
	select {
	case <-ctx.Done():
	case <-g.closed:
	}
	return nil
}

func (g *genSource) Pause(tps []runner.TP) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range tps {
		g.paused[t.Partition] = true
	}
}

func (g *genSource) Resume(tps []runner.TP) {
	g.mu.Lock()
	for _, t := range tps {
		delete(g.paused, t.Partition)
	}
	g.mu.Unlock()
	select {
	case g.resumed <- struct{}{}:
	default:
	}
}

func (g *genSource) Commit(ctx context.Context, offsets []runner.Offset) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, o := range offsets {
		g.committed[o.TP.Partition] = o.Offset
	}
	return nil
}

func (g *genSource) Close() error {
	g.closeOnce.Do(func() { close(g.closed) })
	return nil
}

func (g *genSource) committedTotal() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var s int64
	for _, o := range g.committed {
		s += o
	}
	return s
}
