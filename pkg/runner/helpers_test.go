package runner_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

const topic = "t"

func tp(p int32) runner.TP { return runner.TP{Topic: topic, Partition: p} }

// fill appends n records per partition with keys cycling over keys.
func fill(src *runnertest.Source, partitions, n, keys int) {
	for p := range partitions {
		recs := make([]runner.Record, n)
		for i := range n {
			recs[i] = runner.Record{Topic: topic, Partition: int32(p), Offset: int64(i), Key: []byte(fmt.Sprintf("k%d", i%keys)), Value: []byte("v")}
		}
		src.Append(recs...)
	}
}

// newRunner returns a runner over src or fails the test.
func newRunner(t *testing.T, src runner.Source, opts ...runner.Option) *runner.Runner {
	t.Helper()
	r, err := runner.New(src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// assign gives tps to the runner through src or fails the test.
func assign(t *testing.T, src *runnertest.Source, tps ...runner.TP) {
	t.Helper()
	if err := src.Assign(context.Background(), tps...); err != nil {
		t.Fatal(err)
	}
}

// started runs r in the background and returns a func that waits for Run's
// result.
// shutdownAndWait shuts r down within 10s and waits for the Run that
// started returned (wait), failing the test on either's error.
func shutdownAndWait(t *testing.T, r *runner.Runner, wait func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func started(t *testing.T, r *runner.Runner) func() error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	var once sync.Once
	var err error
	wait := func() error {
		once.Do(func() {
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { r.Close(); _ = wait() })
	return wait
}

// await, inside a synctest bubble, lets the bubble's fake clock run for d
// (the runner's ticks and backoffs and the source's polls fire as they fall
// due; d costs no real time), waits until every goroutine of the bubble is
// blocked, and fails the test unless cond holds then.
func await(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	time.Sleep(d)
	synctest.Wait()
	if !cond() {
		t.Fatalf("not so after %v with the runner idle: %s", d, what)
	}
}

func committedAt(src *runnertest.Source, p int32, want int64) func() bool {
	return func() bool {
		off, ok := src.Committed(tp(p))
		return ok && off == want
	}
}

// meter is a manual OpenTelemetry reader to read the runner's counters.
type meter struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
}

func newMeter() *meter {
	r := sdkmetric.NewManualReader()
	return &meter{reader: r, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))}
}

// metric collects and returns the data of the metric called name, or nil.
func (m *meter) metric(t *testing.T, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if mm.Name == name {
				return mm.Data
			}
		}
	}
	return nil
}

// sum returns the total of an Int64 counter.
func (m *meter) sum(t *testing.T, name string) int64 {
	t.Helper()
	var total int64
	if s, ok := m.metric(t, name).(metricdata.Sum[int64]); ok {
		for _, dp := range s.DataPoints {
			total += dp.Value
		}
	}
	return total
}

// partitionsOf returns the partition ids (messaging.destination.partition.id)
// of the data points of an Int64 counter; "" for a point without one.
func (m *meter) partitionsOf(t *testing.T, name string) []string {
	t.Helper()
	var ids []string
	if s, ok := m.metric(t, name).(metricdata.Sum[int64]); ok {
		for _, dp := range s.DataPoints {
			v, _ := dp.Attributes.Value("messaging.destination.partition.id")
			ids = append(ids, v.AsString())
		}
	}
	return ids
}

// count returns the number of measurements of a Float64 histogram.
func (m *meter) count(t *testing.T, name string) uint64 {
	t.Helper()
	var n uint64
	if h, ok := m.metric(t, name).(metricdata.Histogram[float64]); ok {
		for _, dp := range h.DataPoints {
			n += dp.Count
		}
	}
	return n
}

// driver is a runner.Source whose Sink the test calls directly, so a test
// can report assignments, revokes and fetches in any interleaving (the
// runnertest source serializes them, as a real client does for its own
// callbacks). Pauses and commits are recorded.
type driver struct {
	sinkc chan runner.Sink

	mu       sync.Mutex
	paused   map[runner.TP]bool
	commits  []runner.Offset
	commitFn func(ctx context.Context, offsets []runner.Offset) error // nil: acknowledge
	runs     int
}

func newDriver() *driver {
	return &driver{sinkc: make(chan runner.Sink, 1), paused: map[runner.TP]bool{}}
}

func (d *driver) Run(ctx context.Context, sink runner.Sink) error {
	d.mu.Lock()
	d.runs++
	d.mu.Unlock()
	d.sinkc <- sink
	<-ctx.Done()
	return nil
}

func (d *driver) Pause(tps []runner.TP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, tp := range tps {
		d.paused[tp] = true
	}
}

func (d *driver) Resume(tps []runner.TP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, tp := range tps {
		delete(d.paused, tp)
	}
}

func (d *driver) Commit(ctx context.Context, offsets []runner.Offset) error {
	d.mu.Lock()
	fn := d.commitFn
	d.mu.Unlock()
	if fn != nil {
		if err := fn(ctx, offsets); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.commits = append(d.commits, offsets...)
	return nil
}

func (d *driver) Close() error { return nil }

func (d *driver) isPaused(tp runner.TP) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paused[tp]
}

// sink waits for Run to hand over the Sink.
func (d *driver) sink(t *testing.T) runner.Sink {
	t.Helper()
	select {
	case s := <-d.sinkc:
		return s
	case <-time.After(time.Minute):
		t.Fatal("the runner did not start its source")
		return nil
	}
}

// records returns n records of partition p from offset from, with keys
// cycling over keys.
func records(p int32, from int64, n, keys int) []runner.Record {
	recs := make([]runner.Record, n)
	for i := range recs {
		off := from + int64(i)
		recs[i] = runner.Record{Topic: topic, Partition: p, Offset: off, Key: []byte(fmt.Sprintf("k%d", off%int64(keys))), Value: []byte("v")}
	}
	return recs
}

// batch is one Batch of recs for their partition.
func batch(recs []runner.Record) runner.Batch {
	return runner.Batch{TP: recs[0].TP(), Records: recs, Position: recs[len(recs)-1].Offset + 1, HighWatermark: -1}
}

// gauge returns the value of an Int64 gauge with one data point (the sum if
// it has several).
func (m *meter) gauge(t *testing.T, name string) int64 {
	t.Helper()
	var total int64
	if g, ok := m.metric(t, name).(metricdata.Gauge[int64]); ok {
		for _, dp := range g.DataPoints {
			total += dp.Value
		}
	}
	return total
}

// attr returns the value of attribute key on the first data point of the
// Float64 gauge called name, or "".
func (m *meter) attr(t *testing.T, name, key string) string {
	t.Helper()
	if g, ok := m.metric(t, name).(metricdata.Gauge[float64]); ok && len(g.DataPoints) > 0 {
		if v, ok := g.DataPoints[0].Attributes.Value(attribute.Key(key)); ok {
			return v.Emit()
		}
	}
	return ""
}

// logBuffer collects a runner's log lines (text format).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// has reports whether one line contains every part.
func (l *logBuffer) has(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.buf.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
