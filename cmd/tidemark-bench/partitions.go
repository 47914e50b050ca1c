package main

// The partitions workload: what a record costs as the partition count
// grows, the total number of records staying the same.
//
// For each handler (-partition-handlers: noop, sleep) and each partition
// count (-partition-counts) one topic is created and filled first, every
// topic of a handler with the same number of records (-partition-records
// for noop, -partition-sleep-records for sleep: a 5 ms handler at C=256
// does ~40,000 records/s, the no-op one ten to fifty times that). Then, in
// each of -partition-repeat repetitions, for each count in turn and each
// handler, the plain franz-go poll loop (the baseline) and tidemark over
// each adapter drain the topic, each in its own child process and a fresh
// group. A consumer's cost is its CPU seconds per record: user+sys of its
// child over its whole life (start, join, drain, shutdown), divided by the
// records it handled. Its ratio at a count is the median over the
// repetitions of its CPU per record divided by the baseline's on the same
// topic in the same repetition (run moments before it), and its growth that
// ratio divided by its ratio at the smallest count. The goal: a
// growth of at most partitionGoal at the largest count.
//
// The baseline fetches with exactly the settings of tidemark's franz
// adapter, which derives its fetch sizes from runner.MaxBufferedBytes
// (runner.FetchLimiter): the harness builds the adapter and the runner with
// tidemark's options (adapterFetch), reads the settings back from the
// adapter's franz-go client, and hands them to the baseline's child, which
// checks its client took them; every tidemark-over-franz child reports the
// settings its client had before Run and after it, and the harness fails
// the run if they differ from the baseline's.

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"
)

// partitionGoal is the most tidemark's CPU per record, relative to the
// baseline's, may grow from the smallest partition count to the largest.
const partitionGoal = 1.2

// fileMargin is the open files a kafkago child needs beyond one connection
// per partition: the coordinator's, the runtime's, the profile's.
const fileMargin = 256

// Scaling is the partitions workload's report.
type Scaling struct {
	// Records is the record count of every topic of each handler,
	// Partitions the counts in increasing order, Repeat the repetitions.
	Records    map[string]int `json:"records"`
	Partitions []int          `json:"partitions"`
	Repeat     int            `json:"repeat"`
	// Fetch is the fetch settings of tidemark's franz adapter, which the
	// baseline used too; FetchFrom says how they were obtained.
	Fetch     fetchSettings `json:"fetch"`
	FetchFrom string        `json:"fetch_from"`
	Goal      float64       `json:"goal"`
	Rows      []ScalingRow  `json:"rows"`
	// Profiles are the CPU profiles written (-profile-dir).
	Profiles []string `json:"profiles,omitempty"`
}

// ScalingRow is one consumer at one partition count.
type ScalingRow struct {
	Series      string `json:"series"` // baseline-noop, franz-noop, kafkago-sleep, …
	Consumer    string `json:"consumer"`
	Adapter     string `json:"adapter,omitempty"`
	Handler     string `json:"handler"`
	Concurrency int    `json:"concurrency,omitempty"`
	Partitions  int    `json:"partitions"`
	Records     int    `json:"records"`
	// PerSecond is the median rate over the repetitions (first record to
	// last), Runs every repetition's.
	PerSecond float64   `json:"records_per_second"`
	Runs      []float64 `json:"runs"`
	// CPUPerRecord is the median of the child's CPU seconds (user+sys,
	// whole life) per record, in µs; CPURuns every repetition's.
	// WindowCPUPerRecord is the same for the CPU spent between the first
	// record and the last only (no start, join or shutdown).
	CPUPerRecord       float64   `json:"cpu_us_per_record"`
	CPURuns            []float64 `json:"cpu_us_per_record_runs"`
	WindowCPUPerRecord float64   `json:"window_cpu_us_per_record"`
	WindowCPURuns      []float64 `json:"window_cpu_us_per_record_runs"`
	PeakRSSMiB         float64   `json:"peak_rss_mib"`
	// OutsideCPU is the median of the CPU seconds spent outside the
	// window: start, join, the first fetch, shutdown.
	OutsideCPU float64 `json:"outside_window_cpu_seconds"`
	// CPUGrowth is CPUPerRecord over this series' CPUPerRecord at the
	// smallest count.
	CPUGrowth float64 `json:"cpu_growth"`
	// Ratio (tidemark rows) is the median over the repetitions of CPU per
	// record over that of Baseline (the series of the plain loop on the
	// same topics) in the same repetition; RatioRuns every repetition's.
	// WindowRatio the same for window CPU.
	Baseline    string    `json:"baseline,omitempty"`
	Ratio       float64   `json:"ratio,omitempty"`
	RatioRuns   []float64 `json:"ratio_runs,omitempty"`
	WindowRatio float64   `json:"window_ratio,omitempty"`
	// Growth is Ratio over this series' Ratio at the smallest count: the
	// figure the goal bounds. GrowthRuns is each repetition's own ratio
	// over its own ratio at the smallest count.
	Growth     float64   `json:"growth,omitempty"`
	GrowthRuns []float64 `json:"growth_runs,omitempty"`
	// FetchLowered says the franz adapter lowered its fetch sizes during a
	// run (records smaller than runner.RecordShape states); the baseline
	// then fetched larger.
	FetchLowered string `json:"fetch_lowered,omitempty"`
}

// scalingRun is one child's figures.
type scalingRun struct {
	rate, cpu, window, rss, outside float64
	records                         int
}

// partitionSpecs returns the consumers of handler's topic with partitions
// partitions, the baseline first.
func (b *bench) partitionSpecs(handler, topic string, partitions, records int, fetch fetchSettings, files int) []childSpec {
	base := b.spec(franzLoop, "", topic, handler, 0)
	base.Fetch = &fetch
	specs := []childSpec{base}
	conc := b.c.noopConc
	if handler == "sleep" {
		conc = b.c.concurrency
	}
	for _, a := range b.c.adapters {
		s := b.spec(tidemarkC, a, topic, handler, conc)
		if a == "kafkago" {
			s.Files = files
		}
		specs = append(specs, s)
	}
	for i := range specs {
		specs[i].Records, specs[i].Partitions = records, partitions
	}
	return specs
}

// seriesOf names spec's series: baseline-<handler> for the plain loop (which
// runs no handler: the handler names the topics it read), else
// <adapter>-<handler>.
func seriesOf(s childSpec) string {
	if s.Consumer != tidemarkC {
		return "baseline-" + s.Handler
	}
	return s.Adapter + "-" + s.Handler
}

// partitionRecords is the record count of every topic of handler.
func (b *bench) partitionRecords(handler string) int {
	if handler == "sleep" {
		return b.c.partSleepRecords
	}
	return b.c.partRecords
}

// partitionScaling runs the partitions workload.
func (b *bench) partitionScaling(ctx context.Context) (*Scaling, error) {
	counts := b.c.partCounts
	files := 0
	if slices.Contains(b.c.adapters, "kafkago") {
		files = counts[len(counts)-1] + fileMargin
		if err := raiseFileLimit(files); err != nil {
			return nil, fmt.Errorf("the kafkago adapter opens a connection per partition: %w", err)
		}
	}
	fetch, err := adapterFetch(b.spec(tidemarkC, "franz", "bench-fetch-settings", "noop", b.c.noopConc), quietLogger())
	if err != nil {
		return nil, fmt.Errorf("the franz adapter's fetch settings: %w", err)
	}
	sc := &Scaling{Records: map[string]int{}, Partitions: counts, Repeat: b.c.partRepeat, Fetch: fetch, Goal: partitionGoal,
		FetchFrom: "read back from tidemark's franz adapter's client (kgo.Client.OptValue) after runner.New with tidemark's options; " +
			"each tidemark-over-franz child reported the same before and after its run"}
	b.logf("fetch settings of tidemark's franz adapter, the baseline's too: %v", fetch)

	// topics[handler][count]
	topics := map[string][]string{}
	var made []string
	defer func() {
		if len(made) > 0 {
			b.drop(made...)
		}
	}()
	for _, h := range b.c.partHandlers {
		n := b.partitionRecords(h)
		sc.Records[h] = n
		for _, p := range counts {
			start := time.Now()
			t, err := b.topicOf(ctx, "partitions-"+h, p)
			if err != nil {
				return nil, err
			}
			made = append(made, t)
			topics[h] = append(topics[h], t)
			b.logf("created %s with %d partitions in %v", t, p, time.Since(start).Round(time.Millisecond))
			if err := b.produceTo(ctx, t, p, n, b.c.keys); err != nil {
				return nil, err
			}
		}
	}

	// runs[series][count] holds one scalingRun per repetition.
	var order []string
	specOf := map[string]childSpec{}
	runs := map[string][][]scalingRun{}
	lowered := map[string]map[int]string{}
	for rep := range b.c.partRepeat {
		for ci, p := range counts {
			for _, h := range b.c.partHandlers {
				for _, s := range b.partitionSpecs(h, topics[h][ci], p, b.partitionRecords(h), fetch, files) {
					series := seriesOf(s)
					if _, ok := runs[series]; !ok {
						order = append(order, series)
						specOf[series] = s
						runs[series] = make([][]scalingRun, len(counts))
						lowered[series] = map[int]string{}
					}
					s.Group = b.name("group")
					if b.c.profileDir != "" {
						s.CPUProfile = filepath.Join(b.c.profileDir, fmt.Sprintf("partitions-%s-%d-r%d.pprof", series, p, rep+1))
						sc.Profiles = append(sc.Profiles, s.CPUProfile)
					}
					res, u, err := runChild(ctx, s, nil)
					if err != nil {
						return nil, err
					}
					if s.Consumer == tidemarkC && s.Adapter == "franz" {
						if res.Fetch == nil || *res.Fetch != fetch {
							return nil, fmt.Errorf("tidemark over franz (%s, %d partitions) fetched with %v, the baseline with %v", s.Handler, p, res.Fetch, fetch)
						}
						if res.FetchEnd != nil && *res.FetchEnd != *res.Fetch {
							lowered[series][p] = fmt.Sprintf("lowered to %v", *res.FetchEnd)
						}
					}
					if res.Records < 1 || res.Seconds <= 0 {
						return nil, fmt.Errorf("%s at %d partitions handled %d records in %gs", s.describe(), p, res.Records, res.Seconds)
					}
					r := scalingRun{rate: float64(res.Records) / res.Seconds, cpu: 1e6 * u.CPUSeconds / float64(res.Records),
						window: 1e6 * res.WindowCPU / float64(res.Records), rss: u.PeakRSSMiB, records: res.Records,
						outside: u.CPUSeconds - res.WindowCPU}
					runs[series][ci] = append(runs[series][ci], r)
					b.logf("%-14s %5d partitions %8d records %10.0f/s  %6.3f µs CPU/record (window %6.3f; %.2f s outside)  %4.0f MiB",
						series, p, r.records, r.rate, r.cpu, r.window, r.outside, r.rss)
				}
			}
		}
	}
	for _, series := range order {
		s := specOf[series]
		base := "baseline-" + s.Handler
		for ci, p := range counts {
			row := scalingRow(s, series, p, runs[series][ci], runs[base][ci], runs[series][0], runs[base][0], b.label(s), lowered[series][p])
			if s.Consumer == tidemarkC {
				row.Baseline = base
			}
			sc.Rows = append(sc.Rows, row)
		}
	}
	return sc, nil
}

// scalingRow summarises one series at one count from its runs and the
// baseline's at that count (paired by repetition), and both at the
// smallest count (for the growth).
func scalingRow(s childSpec, series string, p int, own, base, own0, base0 []scalingRun, label, lowered string) ScalingRow {
	pick := func(rs []scalingRun, f func(scalingRun) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	rate := func(r scalingRun) float64 { return r.rate }
	cpu := func(r scalingRun) float64 { return r.cpu }
	window := func(r scalingRun) float64 { return r.window }
	rss := func(r scalingRun) float64 { return r.rss }
	outside := func(r scalingRun) float64 { return r.outside }
	row := ScalingRow{Series: series, Consumer: label, Handler: s.Handler, Partitions: p, Records: own[len(own)-1].records,
		Runs: pick(own, rate), CPURuns: pick(own, cpu), WindowCPURuns: pick(own, window), FetchLowered: lowered}
	if s.Consumer == tidemarkC {
		row.Adapter, row.Concurrency = s.Adapter, s.Concurrency
	}
	row.PerSecond, row.CPUPerRecord, row.WindowCPUPerRecord = median(row.Runs), median(row.CPURuns), median(row.WindowCPURuns)
	row.PeakRSSMiB, row.OutsideCPU = median(pick(own, rss)), median(pick(own, outside))
	if c0 := median(pick(own0, cpu)); c0 > 0 {
		row.CPUGrowth = row.CPUPerRecord / c0
	}
	if s.Consumer != tidemarkC {
		return row
	}
	ratios := func(a, b []scalingRun, f func(scalingRun) float64) []float64 {
		out := make([]float64, min(len(a), len(b)))
		for i := range out {
			out[i] = f(a[i]) / f(b[i])
		}
		return out
	}
	row.RatioRuns = ratios(own, base, cpu)
	row.Ratio = median(row.RatioRuns)
	row.WindowRatio = median(ratios(own, base, window))
	r0runs := ratios(own0, base0, cpu)
	if r0 := median(r0runs); r0 > 0 {
		row.Growth = row.Ratio / r0
	}
	for i := range min(len(row.RatioRuns), len(r0runs)) {
		row.GrowthRuns = append(row.GrowthRuns, row.RatioRuns[i]/r0runs[i])
	}
	return row
}

// printScaling prints the partitions workload's table and the goal.
func printScaling(w io.Writer, sc *Scaling) {
	fmt.Fprintf(w, "\npartitions: %s; %d repetitions; the baseline and tidemark over franz fetch with %v\n",
		recordsText(sc.Records), sc.Repeat, sc.Fetch)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "series\tpartitions\trecords/s\tCPU µs/record\twindow µs/record\tCPU s outside\tCPU ×%d\t÷ baseline\twindow ÷ baseline\tratio ×%d (runs)\tRSS MiB\t\n", sc.Partitions[0], sc.Partitions[0])
	for _, r := range sc.Rows {
		ratio, wratio, growth := "", "", ""
		if r.Ratio > 0 {
			ratio, wratio = fmt.Sprintf("%.2f", r.Ratio), fmt.Sprintf("%.2f", r.WindowRatio)
			growth = fmt.Sprintf("%.2f (", r.Growth)
			for i, g := range r.GrowthRuns {
				if i > 0 {
					growth += " "
				}
				growth += fmt.Sprintf("%.2f", g)
			}
			growth += ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.3f\t%.3f\t%.2f\t%.2f\t%s\t%s\t%s\t%.0f\t%s\n", r.Series, r.Partitions, r.PerSecond, r.CPUPerRecord,
			r.WindowCPUPerRecord, r.OutsideCPU, r.CPUGrowth, ratio, wratio, growth, r.PeakRSSMiB, r.FetchLowered)
	}
	tw.Flush()
	last := sc.Partitions[len(sc.Partitions)-1]
	for _, r := range sc.Rows {
		if r.Ratio > 0 && r.Partitions == last {
			verdict := "met"
			if r.Growth > sc.Goal {
				verdict = "MISSED"
			}
			fmt.Fprintf(w, "goal (ratio grows ≤ %.1f× from %d to %d partitions), %s: %.2f× — %s\n", sc.Goal, sc.Partitions[0], last, r.Series, r.Growth, verdict)
		}
	}
	for _, p := range sc.Profiles {
		fmt.Fprintf(w, "profile: %s\n", p)
	}
}
