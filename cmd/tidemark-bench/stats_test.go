package main

// The pure parts of the harness, tested without a broker. (A command's
// package cannot be imported, so these tests live in package main.)

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample is every percentile", ms(7), 99, 7 * time.Millisecond},
		{"p50 of two is the lower", ms(1, 2), 50, time.Millisecond},
		{"p50 of three is the middle", ms(1, 2, 3), 50, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", hundred, 99, 99 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"p1 of 100 is the min", hundred, 1, time.Millisecond},
		{"p99 of 10 is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"tiny p is the min", ms(1, 2, 3), 0.001, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.samples, tc.p); got != tc.want {
				t.Fatalf("percentile(%v, %v) = %v, want %v", tc.samples, tc.p, got, tc.want)
			}
		})
	}
}

func TestLatenciesSorts(t *testing.T) {
	s := []time.Duration{5, 1, 4, 2, 3, 100, 6, 7, 8, 9}
	p50, p99 := latencies(s)
	if p50 != 5 || p99 != 100 {
		t.Fatalf("p50, p99 = %v, %v, want 5, 100", p50, p99)
	}
	if !slices.IsSorted(s) {
		t.Fatalf("samples not sorted in place: %v", s)
	}
}

// FuzzPercentile checks the nearest-rank definition against its meaning: at
// least p% of the samples are at or below the answer, and fewer than p% are
// strictly below it.
func FuzzPercentile(f *testing.F) {
	f.Add([]byte{3, 1, 2}, 50.0)
	f.Add([]byte{9}, 99.0)
	f.Add([]byte{1, 1, 1, 200, 7}, 1.0)
	f.Fuzz(func(t *testing.T, raw []byte, p float64) {
		if len(raw) == 0 || !(p > 0 && p <= 100) {
			return
		}
		s := make([]time.Duration, len(raw))
		for i, b := range raw {
			s[i] = time.Duration(b)
		}
		slices.Sort(s)
		got := percentile(s, p)
		if !slices.Contains(s, got) {
			t.Fatalf("%v is not a sample", got)
		}
		atOrBelow, below := 0, 0
		for _, x := range s {
			if x <= got {
				atOrBelow++
			}
			if x < got {
				below++
			}
		}
		n := float64(len(s))
		if float64(atOrBelow) < p/100*n-1e-9 {
			t.Fatalf("p%v = %v: only %d of %d at or below", p, got, atOrBelow, len(s))
		}
		if float64(below) >= p/100*n+1e-9 {
			t.Fatalf("p%v = %v: %d of %d already below", p, got, below, len(s))
		}
	})
}

func TestTheory(t *testing.T) {
	const l = 5 * time.Millisecond
	for _, tc := range []struct {
		name    string
		got     float64
		want    float64
		explain string
	}{
		{"C=1", parallelTheory(1, l, 1e6), 200, "1/5ms"},
		{"C=256", parallelTheory(256, l, 1e6), 51_200, "256/5ms"},
		{"C=1024 capped", parallelTheory(1024, l, 100_000), 100_000, "204,800 above the ceiling"},
		{"no ceiling measured", parallelTheory(1024, l, 0), 204_800, "0 means uncapped"},
		{"K=1", keyTheory(1, 256, l, 1e6), 200, "one key runs one at a time"},
		{"K=100 < C", keyTheory(100, 256, l, 1e6), 20_000, "min(K,C)=K"},
		{"K=100000 > C", keyTheory(100_000, 256, l, 1e6), 51_200, "min(K,C)=C"},
		{"K capped", keyTheory(100_000, 256, l, 30_000), 30_000, "ceiling"},
	} {
		if math.Abs(tc.got-tc.want) > 1e-6 {
			t.Errorf("%s: got %v, want %v (%s)", tc.name, tc.got, tc.want, tc.explain)
		}
	}
}

func TestCurveTheoryAt(t *testing.T) {
	conc := Curve{SleepSeconds: 0.005, Ceiling: 100_000}
	keys := Curve{SleepSeconds: 0.005, Ceiling: 100_000, Concurrency: 256}
	for _, tc := range []struct {
		cv      Curve
		x, want float64
	}{
		{conc, 1, 200},
		{conc, 64, 12_800},
		{conc, 1024, 100_000},
		{keys, 1, 200},
		{keys, 256, 51_200},
		{keys, 100_000, 51_200},
		{Curve{SleepSeconds: 0.005}, 1024, 204_800},
	} {
		if got := tc.cv.theoryAt(tc.x); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("theoryAt(%v) of %+v = %v, want %v", tc.x, tc.cv, got, tc.want)
		}
	}
	// The curve's line and the points' theory agree where both exist.
	for _, k := range []int{1, 10, 100, 1000} {
		if a, b := keys.theoryAt(float64(k)), keyTheory(k, 256, 5*time.Millisecond, 100_000); math.Abs(a-b) > 1e-6 {
			t.Errorf("K=%d: theoryAt %v, keyTheory %v", k, a, b)
		}
	}
}

func TestMedianAndMedianRun(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
	if got := median(nil); got != 0 {
		t.Errorf("median empty = %v", got)
	}
	in := []float64{4, 1}
	median(in)
	if in[0] != 4 {
		t.Error("median changed its argument")
	}

	runs := []Result{{PerSecond: 10, PeakRSSMiB: 1}, {PerSecond: 30, PeakRSSMiB: 3}, {PerSecond: 20, PeakRSSMiB: 2}}
	got := medianRun(runs)
	if got.PerSecond != 20 || got.PeakRSSMiB != 2 || !reflect.DeepEqual(got.Runs, []float64{10, 30, 20}) {
		t.Errorf("medianRun = %+v", got)
	}
	if one := medianRun(runs[:1]); one.Runs != nil || one.PerSecond != 10 {
		t.Errorf("medianRun of one = %+v", one)
	}
}

func TestRatios(t *testing.T) {
	base := Result{Consumer: "plain", PerSecond: 200}
	r := Result{PerSecond: 50}
	r.against(base)
	r.ofTheory(100)
	if r.Baseline != "plain" || r.Ratio != 0.25 || r.Theoretical != 100 || r.OfTheory != 0.5 {
		t.Fatalf("got %+v", r)
	}
	// Repeated: the median of the paired ratios, not the ratio of medians.
	rb := Result{Consumer: "plain", PerSecond: 200, Runs: []float64{100, 200, 400}}
	rr := Result{PerSecond: 60, Runs: []float64{50, 60, 100}}
	rr.against(rb)
	if rr.Ratio != 0.3 || !reflect.DeepEqual(rr.RatioRuns, []float64{0.5, 0.3, 0.25}) {
		t.Fatalf("paired ratio = %v %v, want median of 0.5, 0.3, 0.25", rr.Ratio, rr.RatioRuns)
	}
	var z Result
	z.against(Result{Consumer: "nothing"})
	z.ofTheory(0)
	if z.Baseline != "" || z.Ratio != 0 || z.Theoretical != 0 {
		t.Fatalf("a zero baseline or theory must leave no ratio: %+v", z)
	}
}

func TestStampRoundTrip(t *testing.T) {
	v := make([]byte, 100)
	at := time.Unix(1_800_000_000, 123_456_789)
	stamp(v, at)
	got, ok := unstamp(v)
	if !ok || !got.Equal(at) {
		t.Fatalf("unstamp = %v, %v; want %v", got, ok, at)
	}
	for _, bad := range [][]byte{nil, make([]byte, 100), []byte("TMTS")} {
		if _, ok := unstamp(bad); ok {
			t.Errorf("unstamp(%q) found a stamp", bad)
		}
	}
}

func TestReportRoundTrip(t *testing.T) {
	rep := &Report{
		At:      "2026-11-29T10:00:00Z",
		Machine: Machine{CPUs: 2, CPUModel: "AMD EPYC", GoVersion: "go1.26", OS: "linux/amd64"},
		Command: []string{"tidemark-bench", "-workload", "all"},
		Config:  Params{Workloads: []string{"noop"}, Records: 10, Adapters: []string{"franz"}, CurveKeys: []int{1, 10}},
		Results: []Result{
			{Workload: "noop", Consumer: "plain", Records: 10, Seconds: 1, PerSecond: 10, PeakRSSMiB: 12.5, CPUSeconds: 0.5},
			{Workload: "noop", Consumer: "tidemark", Records: 10, Seconds: 2, PerSecond: 5, Baseline: "plain", Ratio: 0.5,
				Runs: []float64{4, 5, 6}, P50: 1.5, P99: 9, LatencyRate: 100, LatencyRecords: 200},
		},
		Curves: []Curve{{Name: "keys", X: "keys K", Fixed: "L=5ms", Theory: "min", Ceiling: 1e6, CeilingFrom: "noop", SleepSeconds: 0.005, Concurrency: 256,
			Points: []Point{{X: 1, Records: 800, Seconds: 4, PerSecond: 200, Theoretical: 200, OfTheory: 1}}}},
		Seconds: 480,
	}
	path := filepath.Join(t.TempDir(), "bench.json")
	if err := writeReport(path, rep); err != nil {
		t.Fatal(err)
	}
	got, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Fatalf("round trip changed the report:\n got %+v\nwant %+v", got, rep)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readReport(path); err == nil {
		t.Fatal("readReport of broken JSON: no error")
	}
}

func TestDrawCurves(t *testing.T) {
	dir := t.TempDir()
	rep := &Report{At: "now", Curves: []Curve{{Name: "concurrency", X: "concurrency C", Fixed: "L=5ms", Theory: "min(C/L, ceiling)", SleepSeconds: 0.005, Ceiling: 100_000,
		Points: []Point{
			{X: 1, PerSecond: 190, Theoretical: 200, OfTheory: 0.95},
			{X: 16, PerSecond: 3000, Theoretical: 3200, OfTheory: 0.94},
			{X: 1024, PerSecond: 0, Theoretical: 204800},
		}}}}
	if err := drawCurves(rep, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "concurrency.png"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Fatalf("not a PNG: % x", b[:min(8, len(b))])
	}
}

func TestExpandWorkloads(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"all", workloadOrder},
		{"keys,noop", []string{"noop", "keys"}},
		{"adapters", []string{"noop", "sleep"}},
		{"curves,inbox", []string{"inbox", "concurrency", "keys"}},
		{"partitions,noop", []string{"noop", "partitions"}},
	} {
		got, err := expandWorkloads(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("expandWorkloads(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := expandWorkloads("noop,bogus"); err == nil {
		t.Error("expandWorkloads accepted an unknown workload")
	}
}

func TestParseFlagsErrors(t *testing.T) {
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "")
	t.Setenv("TIDEMARK_PG_DSN", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "scripts/testbed up && source .testbed/env"},
		{[]string{"-brokers", "x:1", "-workload", "inbox"}, "TIDEMARK_PG_DSN"},
		{[]string{"-brokers", "x:1", "-order", "random"}, "-order"},
		{[]string{"-brokers", "x:1", "-adapter", "sarama"}, "-adapter"},
		{[]string{"-brokers", "x:1", "-size", "4"}, "-size"},
		{[]string{"-brokers", "x:1", "-curve-keys", "1,0"}, "-curve-keys"},
		{[]string{"-brokers", "x:1", "-partition-counts", "12,x"}, "-partition-counts"},
		{[]string{"-brokers", "x:1", "-partition-handlers", "noop,cpu"}, "-partition-handlers"},
		{[]string{"-brokers", "x:1", "-partition-sleep-records", "0"}, "-partition-sleep-records"},
		{[]string{"-replot", "x.json"}, "-plots"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	c, err := parseFlags([]string{"-brokers", "a:1, b:2", "-workload", "noop", "-sleep-records-seconds", "7s"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.brokers, []string{"a:1", "b:2"}) || c.runFor != 7*time.Second {
		t.Errorf("brokers %q, run-for %v", c.brokers, c.runFor)
	}
	c, err = parseFlags([]string{"-brokers", "a:1", "-workload", "partitions", "-partition-counts", "1200,12,120,12", "-partition-handlers", "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.partCounts, []int{12, 120, 1200}) || !slices.Equal(c.partHandlers, []string{"sleep"}) {
		t.Errorf("partition counts %v, handlers %v", c.partCounts, c.partHandlers)
	}
}
