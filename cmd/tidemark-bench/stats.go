package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// Report is what one run of the harness writes as JSON: the machine, the
// parameters, the table and the scaling curves. The plots are drawn from it
// alone (-replot), so a checked-in report and its PNGs always agree.
type Report struct {
	At      string   `json:"at"`
	Machine Machine  `json:"machine"`
	Command []string `json:"command"`
	Config  Params   `json:"config"`
	Results []Result `json:"results"`
	Curves  []Curve  `json:"curves,omitempty"`
	// Servers are the PostgreSQL servers the inbox workload ran on.
	Servers []Server `json:"servers,omitempty"`
	// Scaling is the partitions workload's report.
	Scaling *Scaling `json:"scaling,omitempty"`
	// Share is the share workload's report.
	Share *ShareReport `json:"share,omitempty"`
	// Seconds is the wall time of the whole run, producing included.
	Seconds float64 `json:"seconds"`
}

// Machine describes where the numbers were measured.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model,omitempty"`
	MemoryMiB  int    `json:"memory_mib,omitempty"`
	GoVersion  string `json:"go"`
	OS         string `json:"os"`
	LoadBefore string `json:"load_before,omitempty"`
	LoadAfter  string `json:"load_after,omitempty"`
}

// Params are the parameters a run was made with, as the flags gave them.
type Params struct {
	Workloads             []string `json:"workloads"`
	Records               int      `json:"records"`
	Partitions            int      `json:"partitions"`
	Size                  int      `json:"size"`
	Keys                  int      `json:"keys"`
	Concurrency           int      `json:"concurrency"`
	NoopConcurrency       int      `json:"noop_concurrency"`
	Order                 string   `json:"order"`
	Adapters              []string `json:"adapters"`
	Sleep                 string   `json:"sleep"`
	RunFor                string   `json:"run_for"`
	CPUWork               string   `json:"cpu_work"`
	HashRounds            int      `json:"hash_rounds,omitempty"`
	InboxRecords          int      `json:"inbox_records"`
	InboxBatch            int      `json:"inbox_batch"`
	InboxWait             string   `json:"inbox_batch_wait"`
	InboxDurable          bool     `json:"inbox_durable"`
	LatencyFor            string   `json:"latency_for"`
	LatencyMaxRate        float64  `json:"latency_max_rate"`
	LatencyLoad           float64  `json:"latency_load"`
	Repeat                int      `json:"repeat"`
	HighWaterMark         int      `json:"high_water_mark"`
	CurveConcurrency      []int    `json:"curve_concurrency,omitempty"`
	CurveKeys             []int    `json:"curve_keys,omitempty"`
	PartitionCounts       []int    `json:"partition_counts,omitempty"`
	PartitionRecords      int      `json:"partition_records,omitempty"`
	PartitionSleepRecords int      `json:"partition_sleep_records,omitempty"`
	PartitionRepeat       int      `json:"partition_repeat,omitempty"`
	PartitionHandlers     []string `json:"partition_handlers,omitempty"`
	ShareRecords          int      `json:"share_records,omitempty"`
	ShareSessions         []int    `json:"share_sessions,omitempty"`
	SharePoll             int      `json:"share_poll,omitempty"`
	ShareProcesses        []int    `json:"share_processes,omitempty"`
	ShareQueueSleep       string   `json:"share_queue_sleep,omitempty"`
	ShareQueueConcurrency int      `json:"share_queue_concurrency,omitempty"`
	ShareQueueConfigs     string   `json:"share_queue_configs,omitempty"`
	ShareQueueRecords     int      `json:"share_queue_records,omitempty"`
	ShareStrictLoop       bool     `json:"share_strict_loop,omitempty"`
}

// Result is one consumer on one workload: one row of the table.
type Result struct {
	Workload    string `json:"workload"`
	Consumer    string `json:"consumer"`
	Adapter     string `json:"adapter,omitempty"`
	Order       string `json:"order,omitempty"`
	Concurrency int    `json:"concurrency,omitempty"`
	// Records were handled in Seconds, from the first record handled to
	// the last (the group join and the first fetch are outside the
	// window, for every consumer alike).
	Records   int     `json:"records"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"records_per_second"`
	// Runs are the rates of every repetition when there was more than
	// one; PerSecond is then their median.
	Runs []float64 `json:"runs,omitempty"`
	// P50 and P99 are end-to-end latencies in milliseconds (produce to
	// handler start) measured in a separate paced phase at LatencyRate
	// records/s, on a fresh topic with the consumer already running;
	// LatencyRecords is the number of samples.
	P50            float64 `json:"p50_ms,omitempty"`
	P99            float64 `json:"p99_ms,omitempty"`
	LatencyRate    float64 `json:"latency_rate,omitempty"`
	LatencyRecords int     `json:"latency_records,omitempty"`
	// PeakRSSMiB (VmHWM) and CPUSeconds (rusage user+sys) are those of
	// the consumer's own process over its whole life, join included.
	// WindowCPUSeconds is its CPU time inside the timed window only.
	PeakRSSMiB       float64 `json:"peak_rss_mib,omitempty"`
	CPUSeconds       float64 `json:"cpu_seconds,omitempty"`
	WindowCPUSeconds float64 `json:"window_cpu_seconds,omitempty"`
	// PerTransaction is the inbox's records per transaction when batched.
	PerTransaction float64 `json:"records_per_tx,omitempty"`
	// RoundTrips is the PostgreSQL round trips per record of the inbox
	// and INSERT consumers (counted by a pgx tracer over the whole run).
	RoundTrips float64 `json:"round_trips_per_record,omitempty"`
	Baseline   string  `json:"baseline,omitempty"`
	Ratio      float64 `json:"ratio,omitempty"`
	// RatioRuns are the ratios of each repetition; Ratio is their median.
	RatioRuns   []float64 `json:"ratio_runs,omitempty"`
	Theoretical float64   `json:"theoretical_per_second,omitempty"`
	OfTheory    float64   `json:"ratio_of_theoretical,omitempty"`
}

// Curve is throughput against one parameter, with the theoretical line.
type Curve struct {
	Name   string `json:"name"`
	X      string `json:"x"`
	Fixed  string `json:"fixed"`
	Theory string `json:"theory"`
	// Ceiling is the no-op throughput the theoretical line is capped at,
	// and CeilingFrom the consumer it was measured with; 0 when none was
	// measured in the run.
	Ceiling     float64 `json:"ceiling,omitempty"`
	CeilingFrom string  `json:"ceiling_from,omitempty"`
	// SleepSeconds is the handler's L; Concurrency the fixed C of a keys
	// curve (0 for the concurrency curve, whose x is C).
	SleepSeconds float64 `json:"sleep_seconds"`
	Concurrency  int     `json:"concurrency,omitempty"`
	Points       []Point `json:"points"`
}

// theoryAt is the curve's theoretical line at x: min(x/L, ceiling) for the
// concurrency curve, min(min(x, C)/L, ceiling) for the keys curve.
func (cv Curve) theoryAt(x float64) float64 {
	busy := x
	if cv.Concurrency > 0 {
		busy = min(x, float64(cv.Concurrency))
	}
	t := busy / cv.SleepSeconds
	if cv.Ceiling > 0 {
		t = min(t, cv.Ceiling)
	}
	return t
}

// Point is one measurement of a curve.
type Point struct {
	X           int     `json:"x"`
	Records     int     `json:"records"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"records_per_second"`
	Theoretical float64 `json:"theoretical_per_second"`
	OfTheory    float64 `json:"ratio_of_theoretical"`
	PeakRSSMiB  float64 `json:"peak_rss_mib,omitempty"`
	CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest sample with at least p% of the samples
// at or below it. No interpolation, so the answer is always a latency some
// record actually had. It returns 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// latencies sorts samples in place and returns their p50 and p99.
func latencies(samples []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(samples)
	return percentile(samples, 50), percentile(samples, 99)
}

// parallelTheory is what C handlers taking L each can do at most, C/L per
// second, capped at ceiling (the no-op throughput: no handler makes a
// consumer faster than a handler that does nothing). A ceiling of 0 means
// none was measured and the cap is left out.
func parallelTheory(c int, l time.Duration, ceiling float64) float64 {
	t := float64(c) / l.Seconds()
	if ceiling > 0 {
		t = min(t, ceiling)
	}
	return t
}

// keyTheory is the theoretical throughput in key order: one key's records
// run one at a time, so at most min(K, C) handlers are busy.
func keyTheory(keys, c int, l time.Duration, ceiling float64) float64 {
	return parallelTheory(min(keys, c), l, ceiling)
}

// median returns the median of xs (the mean of the middle two for an even
// count), without changing xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianRun returns the run whose rate is closest to the median of all
// runs' rates (with its RSS, CPU and times), its PerSecond set to that
// median and Runs to every run's rate. One run is returned as it is.
func medianRun(runs []Result) Result {
	if len(runs) == 1 {
		return runs[0]
	}
	rates := make([]float64, len(runs))
	for i, r := range runs {
		rates[i] = r.PerSecond
	}
	m := median(rates)
	best := 0
	for i, r := range rates {
		if math.Abs(r-m) < math.Abs(rates[best]-m) {
			best = i
		}
	}
	out := runs[best]
	out.PerSecond, out.Runs = m, rates
	return out
}

// against sets r's ratio against the baseline b, which must be of the same
// run. When both were repeated alike, the ratio is the median of the ratios
// of each repetition (run i of r against run i of b, taken one after the
// other, so on the same machine weather), not the ratio of the two medians,
// which may come from different moments.
func (r *Result) against(b Result) {
	if b.PerSecond <= 0 {
		return
	}
	r.Baseline, r.Ratio = b.Consumer, r.PerSecond/b.PerSecond
	if len(r.Runs) > 1 && len(r.Runs) == len(b.Runs) {
		ratios := make([]float64, len(r.Runs))
		for i := range r.Runs {
			ratios[i] = r.Runs[i] / b.Runs[i]
		}
		r.Ratio, r.RatioRuns = median(ratios), ratios
	}
}

// ofTheory sets r's theoretical rate and its share of it.
func (r *Result) ofTheory(t float64) {
	if t > 0 {
		r.Theoretical, r.OfTheory = t, r.PerSecond/t
	}
}

// writeReport writes rep as indented JSON to path.
func writeReport(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// readReport reads a report written by writeReport.
func readReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rep, nil
}
