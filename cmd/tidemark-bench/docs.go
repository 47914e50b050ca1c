package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The documents whose figures come from the committed reports in
// docs/bench: each figure stands between a "<!-- generated: NAME -->"
// comment and the next "<!-- end -->", and is written by the generator
// NAME from the reports. `tidemark-bench -write-docs ROOT` rewrites them in
// place; TestDocsGenerated fails when a document differs from what the
// generators make of the committed reports, so a figure cannot drift from
// its report.
var generatedDocs = []string{"README.md", "docs/performance.md", "docs/operations.md", "docs/adapters.md"}

const (
	regionStart = "<!-- generated: "
	regionEnd   = "<!-- end -->"
)

// benchReports are the committed reports the generators read.
type benchReports struct {
	bench *Report // docs/bench/bench.json: make bench
	// partitions holds the partition-scaling report: bench.json's when
	// it has one (make bench runs every workload), else
	// docs/bench/partitions.json's (-workload partitions alone).
	partitions *Report
	// noop is docs/bench/noop.json (a -workload noop run with more
	// repetitions), nil when the directory has none.
	noop *Report
	// adapters is docs/bench/adapters.json (-workload adapters), nil when
	// the directory has none.
	adapters *Report
}

// readBenchReports reads the reports of dir (docs/bench).
func readBenchReports(dir string) (*benchReports, error) {
	bench, err := readReport(filepath.Join(dir, "bench.json"))
	if err != nil {
		return nil, err
	}
	partitions := bench
	if bench.Scaling == nil {
		if partitions, err = readReport(filepath.Join(dir, "partitions.json")); err != nil {
			return nil, err
		}
		if partitions.Scaling == nil {
			return nil, fmt.Errorf("neither bench.json nor partitions.json of %s has a partition-scaling report", dir)
		}
	}
	reps := &benchReports{bench: bench, partitions: partitions}
	for name, rep := range map[string]**Report{"noop.json": &reps.noop, "adapters.json": &reps.adapters} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			if *rep, err = readReport(filepath.Join(dir, name)); err != nil {
				return nil, err
			}
		}
	}
	return reps, nil
}

// generators make the regions' contents, by name. Block regions (the
// comment alone on its line) get the text between blank lines; inline ones
// the text as it is.
var generators = map[string]func(*benchReports) (string, error){
	"bench-table":            benchTable,
	"concurrency-curve":      func(r *benchReports) (string, error) { return curveTable(r.bench, "concurrency", "C") },
	"keys-curve":             func(r *benchReports) (string, error) { return curveTable(r.bench, "keys", "K") },
	"partitions-table":       partitionsTable,
	"operations-concurrency": operationsConcurrency,
	// Inline regions of prose that quotes the reports (docs_prose.go).
	"readme-throughput":  readmeThroughput,
	"noop-ratio":         noopRatio,
	"bench-wall":         benchWall,
	"bench-run":          benchRun,
	"noop-runs":          noopRuns,
	"bench-targets":      benchTargets,
	"reading-noop":       readingNoop,
	"reading-kafkago":    readingKafkago,
	"reading-io":         readingIO,
	"reading-cpu":        readingCPU,
	"reading-inbox":      readingInbox,
	"adapters-bench":     func(r *benchReports) (string, error) { return adaptersCompare(r.bench, "bench.json") },
	"adapters-morning":   func(r *benchReports) (string, error) { return adaptersCompare(r.adapters, "adapters.json") },
	"adapters-table":     adaptersTable,
	"partitions-run":     partitionsRun,
	"partitions-goal":    partitionsGoal,
	"partitions-franz":   partitionsFranz,
	"partitions-kafkago": partitionsKafkago,
}

// writeDocs rewrites the generated regions of generatedDocs under root from
// root/docs/bench.
func writeDocs(root string) error {
	reps, err := readBenchReports(filepath.Join(root, "docs", "bench"))
	if err != nil {
		return err
	}
	for _, name := range generatedDocs {
		path := filepath.Join(root, name)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out, _, err := regenerate(string(b), reps)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if out != string(b) {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "tidemark-bench: rewrote %s\n", name)
		}
	}
	return nil
}

// regenerate returns doc with the content of every generated region made
// again from reps, and the regions' names in order. A region without an
// end, or whose name has no generator, is an error.
func regenerate(doc string, reps *benchReports) (string, []string, error) {
	var (
		b     strings.Builder
		names []string
	)
	rest := doc
	for {
		i := strings.Index(rest, regionStart)
		if i < 0 {
			b.WriteString(rest)
			return b.String(), names, nil
		}
		j := strings.Index(rest[i:], " -->")
		if j < 0 {
			return "", nil, fmt.Errorf("line %d: %q without its closing -->", lineOf(doc, rest, i), regionStart)
		}
		name := rest[i+len(regionStart) : i+j]
		open := rest[:i+j+len(" -->")]
		body := rest[len(open):]
		k := strings.Index(body, regionEnd)
		if k < 0 {
			return "", nil, fmt.Errorf("line %d: generated region %q has no %s", lineOf(doc, rest, i), name, regionEnd)
		}
		if strings.Contains(body[:k], regionStart) {
			return "", nil, fmt.Errorf("line %d: generated region %q holds another one", lineOf(doc, rest, i), name)
		}
		gen, ok := generators[name]
		if !ok {
			return "", nil, fmt.Errorf("line %d: no generator for region %q", lineOf(doc, rest, i), name)
		}
		text, err := gen(reps)
		if err != nil {
			return "", nil, fmt.Errorf("region %q: %w", name, err)
		}
		if strings.HasPrefix(body, "\n") { // a block region
			text = "\n\n" + text + "\n\n"
		}
		b.WriteString(open)
		b.WriteString(text)
		names = append(names, name)
		rest = body[k:]
	}
}

// lineOf is the 1-based line of doc where rest[i] is.
func lineOf(doc, rest string, i int) int {
	return strings.Count(doc[:len(doc)-len(rest)+i], "\n") + 1
}

// benchTable is docs/performance.md's table of make bench's workloads.
func benchTable(reps *benchReports) (string, error) {
	rep := reps.bench
	if len(rep.Results) == 0 {
		return "", errors.New("bench.json has no results")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | consumer | records/s | ratio (median of %d paired; the runs' range) | p50 / p99 ms | RSS MiB | CPU s |\n", rep.Config.Repeat)
	b.WriteString("|---|---|---|---|---|---|---|")
	last := ""
	for _, r := range rep.Results {
		workload := ""
		if r.Workload != last {
			workload, last = workloadLabel(r.Workload, rep.Config), r.Workload
		}
		consumer := r.Consumer
		if r.PerTransaction > 0 {
			consumer += fmt.Sprintf(" (%.1f records/tx)", r.PerTransaction)
		}
		ratio := "baseline"
		if r.Baseline != "" {
			ratio = fmt.Sprintf("**%s** %s", times(r.Ratio), r.Baseline)
			if len(r.RatioRuns) > 1 {
				ratio += fmt.Sprintf(" (runs %s)", span(r.RatioRuns))
			}
			if r.OfTheory > 0 {
				ratio += fmt.Sprintf("; **%.0f%%** of the theoretical %s/s", 100*r.OfTheory, thousands(r.Theoretical))
			}
		}
		latency := "—"
		if r.P50 > 0 {
			latency = fmt.Sprintf("%s / %.0f", twoDigits(r.P50), r.P99)
		}
		b.WriteString("\n" + row(workload, consumer, thousands(r.PerSecond), ratio, latency,
			fmt.Sprintf("%.0f", r.PeakRSSMiB), fmt.Sprintf("%.2f", r.CPUSeconds)))
	}
	return b.String(), nil
}

// workloadLabel names a workload of bench.json as the table does.
func workloadLabel(w string, p Params) string {
	switch {
	case w == "noop":
		return fmt.Sprintf("no-op, %s records", thousands(float64(p.Records)))
	case strings.HasPrefix(w, "sleep"):
		return fmt.Sprintf("sleep %s, %s each", spaced(p.Sleep), spaced(p.RunFor))
	case strings.HasPrefix(w, "cpu"):
		work := p.CPUWork
		if d, err := time.ParseDuration(work); err == nil {
			work = d.Round(time.Microsecond).String()
		}
		return fmt.Sprintf("CPU %s of SHA-256, %s each", spaced(work), spaced(p.RunFor))
	case strings.HasPrefix(w, "inbox"):
		return fmt.Sprintf("inbox, %s records", thousands(float64(p.InboxRecords)))
	}
	return w
}

// curveTable is a scaling curve of bench.json as a table: x, the rate, the
// theory and the share of it reached.
func curveTable(rep *Report, name, x string) (string, error) {
	i := slices.IndexFunc(rep.Curves, func(c Curve) bool { return c.Name == name })
	if i < 0 {
		return "", fmt.Errorf("bench.json has no %s curve", name)
	}
	cv := rep.Curves[i]
	var b strings.Builder
	fmt.Fprintf(&b, "| %s | records/s | theory %s | reached |\n|---|---|---|---|", x, cv.Theory)
	for _, p := range cv.Points {
		fmt.Fprintf(&b, "\n| %s | %s | %s | %.0f%% |", thousands(float64(p.X)), thousands(p.PerSecond), thousands(p.Theoretical), 100*p.OfTheory)
	}
	return b.String(), nil
}

// sleepTheory is the 5 ms rows' share of the theory, over the adapters:
// "84–86%" (or "86%" when they agree).
func sleepTheory(reps *benchReports) (string, error) {
	var of []float64
	for _, r := range reps.bench.Results {
		if strings.HasPrefix(r.Workload, "sleep") && r.OfTheory > 0 {
			of = append(of, math.Round(100*r.OfTheory))
		}
	}
	if len(of) == 0 {
		return "", errors.New("bench.json has no sleep rows measured against the theory")
	}
	lo, hi := slices.Min(of), slices.Max(of)
	if lo == hi {
		return fmt.Sprintf("%.0f%%", lo), nil
	}
	return fmt.Sprintf("%.0f–%.0f%%", lo, hi), nil
}

// operationsConcurrency is docs/operations.md's sentence on concurrency.
func operationsConcurrency(reps *benchReports) (string, error) {
	sleep, err := sleepTheory(reps)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(reps.bench.Curves, func(c Curve) bool { return c.Name == "concurrency" })
	if i < 0 {
		return "", errors.New("bench.json has no concurrency curve")
	}
	var pts []string
	for j, p := range reps.bench.Curves[i].Points {
		c := thousands(float64(p.X))
		if j == 0 {
			c = "C = " + c
		}
		pts = append(pts, fmt.Sprintf("%.0f%% at %s", 100*p.OfTheory, c))
	}
	return fmt.Sprintf("%s of that ideal at C = %d (the %s rows of [performance.md](performance.md#the-table)); in its concurrency curve %s",
		sleep, reps.bench.Config.Concurrency, spaced(reps.bench.Config.Sleep), strings.Join(pts, ", ")), nil
}

// partitionsTable is docs/performance.md's partition-scaling table.
func partitionsTable(reps *benchReports) (string, error) {
	sc := reps.partitions.Scaling
	if len(sc.Rows) == 0 {
		return "", errors.New("partitions.json has no rows")
	}
	most := slices.Max(sc.Partitions)
	first := slices.Min(sc.Partitions)
	var b strings.Builder
	fmt.Fprintf(&b, "| handler | consumer | partitions | records/s | CPU µs/record | CPU ÷ at %d | ÷ plain loop | growth (runs) | CPU s outside the window | RSS MiB |\n", first)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|")
	lastHandler, lastSeries := "", ""
	for _, r := range sc.Rows {
		handler, consumer := "", ""
		if r.Handler != lastHandler {
			handler, lastHandler = r.Handler, r.Handler
			if handler == "noop" {
				handler = "no-op"
			} else if handler == "sleep" && reps.partitions.Config.Sleep != "" {
				handler = "sleep " + spaced(reps.partitions.Config.Sleep)
			}
		}
		if r.Series != lastSeries {
			consumer, lastSeries = r.Consumer, r.Series
		}
		ratio, growth := "baseline", "—"
		if r.Baseline != "" {
			ratio, growth = times(r.Ratio), times(r.Growth)
			if r.Partitions != first && len(r.GrowthRuns) > 1 {
				growth += fmt.Sprintf(" (%s)", span(r.GrowthRuns))
			}
			if r.Partitions == most {
				growth = "**" + strings.Replace(growth, " (", "** (", 1)
				if !strings.Contains(growth, "** (") {
					growth += "**"
				}
			}
		} else if r.Partitions != first {
			ratio = ""
			growth = ""
		}
		b.WriteString("\n" + row(handler, consumer, thousands(float64(r.Partitions)), thousands(r.PerSecond),
			fmt.Sprintf("%.2f", r.CPUPerRecord), times(r.CPUGrowth), ratio, growth,
			fmt.Sprintf("%.2f", r.OutsideCPU), fmt.Sprintf("%.0f", r.PeakRSSMiB)))
	}
	return b.String(), nil
}

// row is a table row of cells; an empty cell is "| |".
func row(cells ...string) string {
	var b strings.Builder
	b.WriteString("|")
	for _, c := range cells {
		if c == "" {
			b.WriteString(" |")
		} else {
			b.WriteString(" " + c + " |")
		}
	}
	return b.String()
}

// span is the range of ratios xs without their unit: "0.68–0.81", "229"
// when they agree to the digits shown.
func span(xs []float64) string {
	lo, hi := strings.TrimSuffix(times(slices.Min(xs)), "×"), strings.TrimSuffix(times(slices.Max(xs)), "×")
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

// times formats a ratio: 229×, 2.40×, 0.77×.
func times(x float64) string {
	if x >= 10 {
		return fmt.Sprintf("%.0f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

// twoDigits formats a latency in ms: 1.3, 15.
func twoDigits(x float64) string {
	if x >= 10 {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}

// thousands formats x rounded, with commas: 4,036,342.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// spaced writes a duration with a space before its unit: "5ms" → "5 ms".
func spaced(d string) string {
	i := strings.IndexFunc(d, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i <= 0 {
		return d
	}
	return d[:i] + " " + d[i:]
}
