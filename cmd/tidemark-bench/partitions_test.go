package main

import (
	"context"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFetchSettingsRoundTrip checks that opts sets every field clientFetch
// reads back, so the baseline's client cannot silently fetch with a
// default where the adapter's does not.
func TestFetchSettingsRoundTrip(t *testing.T) {
	for _, f := range []fetchSettings{
		{MaxBytes: 416455, MaxPartitionBytes: 100_000, ConcurrentFetches: 3, MaxWait: 500 * time.Millisecond, MinBytes: 7, ReadCommitted: true},
		{MaxBytes: 1 << 20, MaxPartitionBytes: 1 << 19, ConcurrentFetches: 1, MaxWait: 250 * time.Millisecond, MinBytes: 1, ReadCommitted: false},
	} {
		cl, err := kgo.NewClient(append(f.opts(), kgo.SeedBrokers("127.0.0.1:1"))...)
		if err != nil {
			t.Fatal(err)
		}
		got := clientFetch(cl)
		cl.Close()
		if got != f {
			t.Errorf("a client made with %v fetches with %v", f, got)
		}
	}
}

// captured keeps the attributes of the log records whose message starts
// with prefix.
type captured struct {
	mu     sync.Mutex
	prefix string
	attrs  []map[string]slog.Value
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, c.prefix) {
		return nil
	}
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	c.mu.Lock()
	c.attrs = append(c.attrs, m)
	c.mu.Unlock()
	return nil
}
func (c *captured) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *captured) WithGroup(string) slog.Handler      { return c }

// TestAdapterFetchIsTheAdapters checks adapterFetch against the franz
// adapter's own log line of the sizes it derived from the memory bound, and
// that those are not franz-go's defaults (which the plain loop of the noop
// workload uses): a baseline given franz-go's defaults would fail here.
func TestAdapterFetchIsTheAdapters(t *testing.T) {
	h := &captured{prefix: "fetch sizes derived"}
	spec := childSpec{Consumer: tidemarkC, Adapter: "franz", Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g",
		Handler: "noop", Concurrency: 64, Order: "key", High: 10_000}
	f, err := adapterFetch(spec, slog.New(h))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.attrs) != 1 {
		t.Fatalf("the adapter logged %d lines of derived fetch sizes, want 1", len(h.attrs))
	}
	a := h.attrs[0]
	if got := a["fetch_max_bytes"].Int64(); got != int64(f.MaxBytes) {
		t.Errorf("the adapter logged fetch_max_bytes %d, adapterFetch read %d", got, f.MaxBytes)
	}
	if got := a["fetch_max_partition_bytes"].Int64(); got != int64(f.MaxPartitionBytes) {
		t.Errorf("the adapter logged fetch_max_partition_bytes %d, adapterFetch read %d", got, f.MaxPartitionBytes)
	}
	if got := a["concurrent_fetches"].Int64(); got != int64(f.ConcurrentFetches) {
		t.Errorf("the adapter logged concurrent_fetches %d, adapterFetch read %d", got, f.ConcurrentFetches)
	}
	defaults, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	d := clientFetch(defaults)
	defaults.Close()
	if f.MaxBytes == d.MaxBytes || f.MaxPartitionBytes == d.MaxPartitionBytes || f.MaxWait == d.MaxWait || f.ReadCommitted == d.ReadCommitted {
		t.Errorf("adapterFetch gave %v, franz-go's defaults are %v: the adapter's own settings were expected", f, d)
	}
	// -fetch-partition-bytes is replaced by the derived size, as the
	// adapter documents.
	spec.PartBytes = 12345
	g, err := adapterFetch(spec, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if g != f {
		t.Errorf("with kgo.FetchMaxPartitionBytes(12345) given, adapterFetch gave %v, want %v", g, f)
	}
}

func TestScalingRow(t *testing.T) {
	runs := func(cpus ...float64) []scalingRun {
		out := make([]scalingRun, len(cpus))
		for i, c := range cpus {
			out[i] = scalingRun{rate: 1000 * float64(i+1), cpu: c, window: c / 2, rss: 10, outside: 0.1, records: 100}
		}
		return out
	}
	base0, own0 := runs(1, 1, 2), runs(2, 3, 4) // ratios 2, 3, 2 → 2
	base, own := runs(2, 4, 2), runs(5, 4, 7)   // ratios 2.5, 1, 3.5 → 2.5
	s := childSpec{Consumer: tidemarkC, Adapter: "franz", Handler: "noop", Concurrency: 64}
	r := scalingRow(s, "franz-noop", 1200, own, base, own0, base0, "label", "")
	want := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	want("Ratio", r.Ratio, 2.5)
	want("Growth", r.Growth, 1.25)
	want("CPUPerRecord", r.CPUPerRecord, 5)
	want("CPUGrowth", r.CPUGrowth, 5.0/3)
	want("WindowRatio", r.WindowRatio, 2.5)
	want("PerSecond", r.PerSecond, 2000)
	if !slices.Equal(r.RatioRuns, []float64{2.5, 1, 3.5}) {
		t.Errorf("RatioRuns %v", r.RatioRuns)
	}
	// Each repetition against its own ratio at the smallest count.
	if g := r.GrowthRuns; len(g) != 3 || math.Abs(g[0]-1.25) > 1e-9 || math.Abs(g[1]-1.0/3) > 1e-9 || math.Abs(g[2]-1.75) > 1e-9 {
		t.Errorf("GrowthRuns %v, want [1.25 0.333 1.75]", g)
	}
	b := scalingRow(childSpec{Consumer: franzLoop, Handler: "noop"}, "baseline-noop", 1200, base, base, base0, base0, "plain", "")
	if b.Ratio != 0 || b.Growth != 0 || b.RatioRuns != nil {
		t.Errorf("a baseline row has a ratio: %+v", b)
	}
	want("baseline CPUGrowth", b.CPUGrowth, 2)
}

func TestRaiseFileLimit(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if err := raiseFileLimit(int(min(lim.Cur, 64))); err != nil {
		t.Errorf("raiseFileLimit below the soft limit: %v", err)
	}
	if lim.Max < math.MaxInt32 {
		err := raiseFileLimit(int(lim.Max) + 1)
		if err == nil || !strings.Contains(err.Error(), "hard limit") || !strings.Contains(err.Error(), "ulimit") {
			t.Errorf("raiseFileLimit above the hard limit %d: %v, want an error naming the hard limit and ulimit", lim.Max, err)
		}
	}
	if lim.Cur < lim.Max {
		n := int(min(lim.Max, lim.Cur+16))
		if err := raiseFileLimit(n); err != nil {
			t.Fatal(err)
		}
		var now syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil {
			t.Fatal(err)
		}
		if now.Cur < uint64(n) {
			t.Errorf("soft limit %d after raiseFileLimit(%d)", now.Cur, n)
		}
	}
}
func TestDrawScaling(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "yet")
	sc := &Scaling{Records: map[string]int{"noop": 100}, Partitions: []int{12, 120, 1200}, Repeat: 1, Goal: partitionGoal}
	for i, p := range sc.Partitions {
		sc.Rows = append(sc.Rows,
			ScalingRow{Series: "baseline-noop", Partitions: p, CPUPerRecord: 0.5 * float64(i+1)},
			ScalingRow{Series: "franz-noop", Partitions: p, CPUPerRecord: 1.2 * float64(i+1), Ratio: 2.4, Growth: 1 + 0.3*float64(i)})
	}
	if err := drawCurves(&Report{At: "now", Scaling: sc}, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "partitions.png"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Fatalf("not a PNG: % x", b[:min(8, len(b))])
	}
}
