package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// partAttrs is the attribute set of tidemark's own per-partition metrics
// for partition p, rendered as kvs renders it, joined with more.
func partAttrs(p int32, more ...string) string {
	out := append([]string{
		"messaging.consumer.group.name=STRING:" + group,
		"messaging.destination.name=STRING:" + topic,
		fmt.Sprintf("messaging.destination.partition.id=STRING:%d", p),
	}, more...)
	slices.Sort(out)
	return strings.Join(out, ",")
}

// procAttrs is the attribute set of the conventions' metrics for p: the
// partition's, with messaging.system and messaging.operation.name.
func procAttrs(p int32, more ...string) string {
	return partAttrs(p, append([]string{"messaging.system=STRING:kafka", "messaging.operation.name=STRING:process"}, more...)...)
}

const groupAttrs = "messaging.consumer.group.name=STRING:" + group

// collected is one collection of a meter's metrics, by name.
type collected map[string]metricdata.Metrics

func collect(t *testing.T, m *meter) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			out[mm.Name] = mm
		}
	}
	return out
}

// points returns metric name's data points by attribute set (as partAttrs
// renders them): a sum's or gauge's value, a histogram's count. It fails
// the test if the metric is missing or its unit is not unit.
func (c collected) points(t *testing.T, name, unit string) map[string]float64 {
	t.Helper()
	mm, ok := c[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	if mm.Unit != unit {
		t.Errorf("%s: unit %q, want %q", name, mm.Unit, unit)
	}
	out := map[string]float64{}
	switch d := mm.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out[strings.Join(kvs(dp.Attributes.ToSlice()), ",")] = float64(dp.Value)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			out[strings.Join(kvs(dp.Attributes.ToSlice()), ",")] = float64(dp.Value)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			out[strings.Join(kvs(dp.Attributes.ToSlice()), ",")] = dp.Value
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out[strings.Join(kvs(dp.Attributes.ToSlice()), ",")] = float64(dp.Count)
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			out[strings.Join(kvs(dp.Attributes.ToSlice()), ",")] = float64(dp.Count)
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, mm.Data)
	}
	return out
}

// expect checks metric name's data points are exactly want.
func (c collected) expect(t *testing.T, name, unit string, want map[string]float64) {
	t.Helper()
	got := c.points(t, name, unit)
	if !mapsEqual(got, want) {
		t.Errorf("%s: data points\n%s\nwant\n%s", name, render(got), render(want))
	}
}

func render(points map[string]float64) string {
	var lines []string
	for k, v := range points {
		lines = append(lines, fmt.Sprintf("  {%s} %v", k, v))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestMetricsByTheConventions: with a meter provider, the runner records
// messaging.process.duration (seconds, explicit buckets from 100 µs to a
// minute, error.type on a record that failed) and
// messaging.client.consumed.messages with the conventions' attributes,
// and its own per-record and per-partition metrics with the group, topic
// and partition (a string) and their units: handled, failed, retried,
// skipped, replay_skipped, fenced, lost, revoke duration, commit failures,
// lag and the oldest record's age; revokes and commit latency with the
// group alone.
func TestMetricsByTheConventions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := groupedSource{runnertest.New()}
		src.Append(
			runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a")},
			runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte("poison")},
			runner.Record{Topic: topic, Partition: 1, Offset: 0, Key: []byte("b")},
			runner.Record{Topic: topic, Partition: 1, Offset: 1, Key: []byte("applied")},
			runner.Record{Topic: topic, Partition: 2, Offset: 0, Key: []byte("fenced")},
		)
		src.FailCommits(1)
		m := newMeter()
		hook := func(_ context.Context, as []runner.Assignment) ([]runner.Applied, error) {
			out := make([]runner.Applied, len(as))
			for i, a := range as {
				if a.TP == tp(1) {
					out[i] = func(off int64) bool { return off == 1 }
				}
			}
			return out, nil
		}
		r := newRunner(t, src, runner.Handle(topic, func(_ context.Context, rec runner.Record) error {
			switch string(rec.Key) {
			case "poison":
				return &rejectedError{}
			case "fenced":
				return fmt.Errorf("lease moved: %w", runner.ErrFenced)
			}
			return nil
		}), runner.MeterProvider(m.provider), runner.Failure(runner.Skip(2)), runner.OnAssign(hook),
			runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src.Source, tp(0), tp(1), tp(2))
		await(t, 5*time.Second, "partitions 0 and 1 committed", func() bool {
			return committedAt(src.Source, 0, 2)() && committedAt(src.Source, 1, 2)()
		})
		c := collect(t, m) // before the revoke and the loss: the gauges of all three
		for _, name := range []string{"tidemark.consumer.lag", "tidemark.partition.uncommitted"} {
			c.expect(t, name, "{record}", map[string]float64{partAttrs(0): 0, partAttrs(1): 0, partAttrs(2): 1})
		}
		oldest := c.points(t, "tidemark.record.oldest_age", "s")
		for _, want := range []string{
			partAttrs(0, "tidemark.record.state=STRING:none"),
			partAttrs(1, "tidemark.record.state=STRING:none"),
			partAttrs(2, "tidemark.record.state=STRING:fenced"),
		} {
			if _, ok := oldest[want]; !ok || len(oldest) != 3 {
				t.Errorf("tidemark.record.oldest_age: data points\n%s\nwant one for {%s}, of 3", render(oldest), want)
			}
		}
		c.expect(t, "tidemark.partitions.owned", "{partition}", map[string]float64{groupAttrs: 3})

		if err := src.Revoke(context.Background(), tp(1)); err != nil {
			t.Fatal(err)
		}
		if err := src.Lose(context.Background(), tp(2)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		c = collect(t, m)
		c.expect(t, "messaging.client.consumed.messages", "{message}", map[string]float64{procAttrs(0): 2, procAttrs(1): 2, procAttrs(2): 1})
		c.expect(t, "messaging.process.duration", "s", map[string]float64{
			procAttrs(0): 1, procAttrs(0, "error.type=STRING:*runner_test.rejectedError"): 1,
			procAttrs(1): 2, // handled, and completed as applied before
			procAttrs(2, "error.type=STRING:runner.ErrFenced"): 1,
		})
		wantBounds := []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
		for _, dp := range c["messaging.process.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
			if !slices.Equal(dp.Bounds, wantBounds) {
				t.Errorf("messaging.process.duration: bounds %v, want %v", dp.Bounds, wantBounds)
			}
		}
		c.expect(t, "tidemark.records.handled", "{record}", map[string]float64{partAttrs(0): 1, partAttrs(1): 1})
		c.expect(t, "tidemark.records.failed", "{attempt}", map[string]float64{partAttrs(0): 2})
		c.expect(t, "tidemark.records.retried", "{attempt}", map[string]float64{partAttrs(0): 1})
		c.expect(t, "tidemark.records.skipped", "{record}", map[string]float64{partAttrs(0): 1})
		c.expect(t, "tidemark.records.replay_skipped", "{record}", map[string]float64{partAttrs(1): 1})
		c.expect(t, "tidemark.records.fenced", "{record}", map[string]float64{partAttrs(2): 1})
		c.expect(t, "tidemark.partitions.lost", "{partition}", map[string]float64{partAttrs(2): 1})
		c.expect(t, "tidemark.revoke.duration", "s", map[string]float64{partAttrs(1): 1})
		c.expect(t, "tidemark.revokes", "{revoke}", map[string]float64{groupAttrs: 1})
		// The first commit failed: each of its partitions is counted.
		failures := c.points(t, "tidemark.commit.failures", "{commit}")
		if len(failures) == 0 {
			t.Error("tidemark.commit.failures: no data point after a failed commit")
		}
		for k, v := range failures {
			if v != 1 || k != partAttrs(0) && k != partAttrs(1) && k != partAttrs(2) {
				t.Errorf("tidemark.commit.failures: {%s} %v, want 1 for a partition's attributes", k, v)
			}
		}
		if got := c.points(t, "tidemark.commit.duration", "s"); len(got) != 1 || got[groupAttrs] < 2 {
			t.Errorf("tidemark.commit.duration: data points\n%s\nwant commits counted under {%s}", render(got), groupAttrs)
		}
	})
}

// TestDeadLetteredCountedPerPartition: a dead-lettered record is counted
// with its partition's attributes, and its duration has its error.type.
func TestDeadLetteredCountedPerPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := groupedSource{runnertest.New()}
		src.Append(runner.Record{Topic: topic, Partition: 3, Offset: 0, Key: []byte("poison")})
		m := newMeter()
		dlw := okWriter{}
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return &rejectedError{} }),
			runner.MeterProvider(m.provider), runner.Failure(runner.DeadLetter("dlt", 1, dlw)), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src.Source, tp(3))
		await(t, 5*time.Second, "the record committed", committedAt(src.Source, 3, 1))
		c := collect(t, m)
		c.expect(t, "tidemark.records.dead_lettered", "{record}", map[string]float64{partAttrs(3): 1})
		c.expect(t, "messaging.process.duration", "s", map[string]float64{procAttrs(3, "error.type=STRING:*runner_test.rejectedError"): 1})
	})
}

// refusingMeter refuses every instrument, naming it.
type refusingMeter struct{ metricnoop.Meter }

func refused(name string) error { return errors.New("refused " + name) }

func (refusingMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return metricnoop.Int64Counter{}, refused(name)
}

func (refusingMeter) Int64Histogram(name string, _ ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	return metricnoop.Int64Histogram{}, refused(name)
}

func (refusingMeter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return metricnoop.Float64Histogram{}, refused(name)
}

func (refusingMeter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return metricnoop.Int64ObservableGauge{}, refused(name)
}

func (refusingMeter) Float64ObservableGauge(name string, _ ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	return metricnoop.Float64ObservableGauge{}, refused(name)
}

type refusingProvider struct{ metricnoop.MeterProvider }

func (refusingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

// TestNewReturnsEveryInstrumentError: New returns every instrument the
// meter refused, joined, not only the first.
func TestNewReturnsEveryInstrumentError(t *testing.T) {
	_, err := runner.New(runnertest.New(), runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.MeterProvider(refusingProvider{}))
	if err == nil {
		t.Fatal("New succeeded with a meter that refuses every instrument")
	}
	for _, name := range []string{
		"messaging.client.consumed.messages", "messaging.process.duration",
		"tidemark.records.handled", "tidemark.records.failed", "tidemark.records.retried",
		"tidemark.records.dead_lettered", "tidemark.records.skipped", "tidemark.records.replay_skipped",
		"tidemark.records.fenced", "tidemark.records.out_of_order", "tidemark.records.redelivered", "tidemark.records.settled",
		"tidemark.completions.stale", "tidemark.partitions.lost", "tidemark.revokes", "tidemark.partitions.pauses",
		"tidemark.partitions.window_pauses", "tidemark.commit.failures", "tidemark.record.delivery_count",
		"tidemark.commit.duration", "tidemark.revoke.duration", "tidemark.records.in_flight",
		"tidemark.records.buffered", "tidemark.records.bytes", "tidemark.partitions.paused",
		"tidemark.partitions.window_full", "tidemark.partitions.owned", "tidemark.partition.uncommitted",
		"tidemark.consumer.lag", "tidemark.record.oldest_age",
	} {
		if !strings.Contains(err.Error(), "refused "+name+"\n") && !strings.HasSuffix(err.Error(), "refused "+name) {
			t.Errorf("New's error does not name %s:\n%v", name, err)
		}
	}
}
