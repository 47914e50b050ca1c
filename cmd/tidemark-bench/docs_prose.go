package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The generators of the inline regions: the prose of README.md and
// docs/performance.md that quotes figures of docs/bench/*.json. Each
// writes the sentence around its figures too when a word of it depends
// on them ("met", "≥", "above that"), so that a new report cannot leave
// a figure, or the judgement made of it, behind. Figures that no
// committed report holds (earlier runs, other machines) stay outside the
// regions, dated in the prose.

// The targets that docs/performance.md measures the table
// against.
const (
	ioTarget   = 0.80 // I/O-bound: share of min(C/L, no-op ceiling)
	noopTarget = 0.70 // no-op: tidemark over franz ÷ the plain franz loop
)

// result is the row of rep whose workload and consumer begin so.
func result(rep *Report, workload, consumer string) (*Result, error) {
	if rep == nil {
		return nil, errors.New("no report")
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		if strings.HasPrefix(r.Workload, workload) && strings.HasPrefix(r.Consumer, consumer) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("no %q row of %q in the report of %s", consumer, workload, rep.At)
}

// results are the rows named, in order; the first error stops them.
func results(rep *Report, pairs ...string) ([]*Result, error) {
	var out []*Result
	for i := 0; i+1 < len(pairs); i += 2 {
		r, err := result(rep, pairs[i], pairs[i+1])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// below counts the runs under x.
func below(runs []float64, x float64) int {
	n := 0
	for _, r := range runs {
		if r < x {
			n++
		}
	}
	return n
}

// met is "met" or "not met".
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// noopRows are the no-op rows of tidemark over franz and of the goroutine
// pool in rep.
func noopRows(rep *Report) (tm, pool *Result, err error) {
	rs, err := results(rep, "noop", "tidemark over franz", "noop", "franz-go loop + goroutine pool")
	if err != nil {
		return nil, nil, err
	}
	return rs[0], rs[1], nil
}

// readmeThroughput is README.md's sentence on throughput with trivial
// handlers.
func readmeThroughput(reps *benchReports) (string, error) {
	rs, err := results(reps.bench, "noop", "tidemark over franz", "sleep", "tidemark over franz")
	if err != nil {
		return "", err
	}
	noop, sleep := rs[0], rs[1]
	day, _, _ := strings.Cut(reps.bench.At, "T")
	return fmt.Sprintf("With a no-op handler tidemark reaches a median %s (%s over %d paired runs) the records/s of a franz-go loop that does nothing, in the `make bench` of %s, on a %d-core machine shared with the broker. With a %s handler it reaches %.0f%% of the theoretical %d/%s and %s a sequential consumer",
		times(noop.Ratio), span(noop.RatioRuns), len(noop.RatioRuns), day, reps.bench.Machine.CPUs,
		spaced(reps.bench.Config.Sleep), 100*sleep.OfTheory, sleep.Concurrency, spaced(reps.bench.Config.Sleep), times(sleep.Ratio)), nil
}

// noopRatio is the table's no-op ratio of tidemark over franz.
func noopRatio(reps *benchReports) (string, error) {
	r, err := result(reps.bench, "noop", "tidemark over franz")
	if err != nil {
		return "", err
	}
	return times(r.Ratio), nil
}

// minutes writes seconds as "4 min 32 s".
func minutes(s float64) string {
	d := time.Duration(math.Round(s)) * time.Second
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

// benchWall is make bench's wall time.
func benchWall(reps *benchReports) (string, error) {
	if reps.bench.Seconds == 0 {
		return "", errors.New("bench.json has no wall time (seconds)")
	}
	return "**" + minutes(reps.bench.Seconds) + "**", nil
}

// benchRun is when make bench ran, how long, and the load around it.
func benchRun(reps *benchReports) (string, error) {
	at, err := time.Parse(time.RFC3339, reps.bench.At)
	if err != nil {
		return "", fmt.Errorf("bench.json's at: %w", err)
	}
	m := reps.bench.Machine
	load := func(s string) string {
		f := strings.Fields(s)
		if len(f) == 0 {
			return "?"
		}
		return f[0]
	}
	return fmt.Sprintf("%s UTC, `make bench` (%s; load %s before, %s after)",
		at.UTC().Format("2006-01-02 15:04"), minutes(reps.bench.Seconds), load(m.LoadBefore), load(m.LoadAfter)), nil
}

// noopRuns is what noop.json's repetitions give.
func noopRuns(reps *benchReports) (string, error) {
	tm, pool, err := noopRows(reps.noop)
	if err != nil {
		return "", fmt.Errorf("noop.json: %w", err)
	}
	return fmt.Sprintf("over its %d paired runs the median is **%s**, the range %s, and %d of the %d were below %.2f; the goroutine pool: median %s, range %s",
		len(tm.RatioRuns), times(tm.Ratio), span(tm.RatioRuns), below(tm.RatioRuns, noopTarget), len(tm.RatioRuns), noopTarget,
		times(pool.Ratio), span(pool.RatioRuns)), nil
}

// benchTargets is docs/performance.md's paragraph on the throughput targets.
func benchTargets(reps *benchReports) (string, error) {
	rs, err := results(reps.bench, "sleep", "tidemark over franz", "sleep", "tidemark over kafkago")
	if err != nil {
		return "", err
	}
	franz, kgo := rs[0], rs[1]
	tm, pool, err := noopRows(reps.bench)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "I/O-bound ≥ %.0f%% of min(C/L, no-op ceiling) — %s (%.0f%% over franz, %.0f%% over kafkago). ",
		100*ioTarget, met(franz.OfTheory >= ioTarget && kgo.OfTheory >= ioTarget), 100*franz.OfTheory, 100*kgo.OfTheory)
	medians := []string{fmt.Sprintf("%s over %d paired runs in `make bench`", times(tm.Ratio), len(tm.RatioRuns))}
	ok := tm.Ratio >= noopTarget
	under := []string{fmt.Sprintf("%d of the %d", below(tm.RatioRuns, noopTarget), len(tm.RatioRuns))}
	n := below(tm.RatioRuns, noopTarget)
	pools := []string{times(pool.Ratio)}
	if reps.noop != nil {
		ntm, npool, err := noopRows(reps.noop)
		if err != nil {
			return "", fmt.Errorf("noop.json: %w", err)
		}
		medians = append(medians, fmt.Sprintf("%s over %d in noop.json", times(ntm.Ratio), len(ntm.RatioRuns)))
		ok = ok && ntm.Ratio >= noopTarget
		under = append(under, fmt.Sprintf("%d of the %d", below(ntm.RatioRuns, noopTarget), len(ntm.RatioRuns)))
		n += below(ntm.RatioRuns, noopTarget)
		pools = append(pools, times(npool.Ratio))
	}
	fmt.Fprintf(&b, "No-op ≥ %.1f× the plain franz loop — ", noopTarget)
	switch {
	case !ok:
		fmt.Fprintf(&b, "not met (%s)", strings.Join(medians, ", "))
	case n == 0:
		fmt.Fprintf(&b, "met by every run (%s)", strings.Join(medians, ", "))
	default:
		fmt.Fprintf(&b, "met by the medians (%s), not by every run: %s fell below %.2f", strings.Join(medians, ", "), strings.Join(under, " and "), noopTarget)
	}
	fmt.Fprintf(&b, ". A franz-go loop that only hands each record to a goroutine pool (no ordering, no offsets, no commits) reaches %s in the same runs", strings.Join(pools, " and "))
	return b.String(), nil
}

// readingNoop is "Reading the table"'s no-op item.
func readingNoop(reps *benchReports) (string, error) {
	tm, pool, err := noopRows(reps.bench)
	if err != nil {
		return "", err
	}
	plain, err := result(reps.bench, "noop", "plain franz-go poll loop")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "tidemark over franz reaches %s the plain franz loop in this run", times(tm.Ratio))
	if reps.noop != nil {
		ntm, _, err := noopRows(reps.noop)
		if err != nil {
			return "", fmt.Errorf("noop.json: %w", err)
		}
		fmt.Fprintf(&b, " (%s over the %d paired runs of noop.json)", times(ntm.Ratio), len(ntm.RatioRuns))
	}
	fmt.Fprintf(&b, ", the target being %.1f×. The plain loop does nothing with a record, not even touch it; tidemark runs each through a lane, a worker, the watermark tracker and a commit, with %s the plain loop's CPU seconds (%.2f against %.2f). The goroutine pool, which only hands each record to a worker and back, uses %.2f s and reaches %s",
		noopTarget, times(tm.CPUSeconds/plain.CPUSeconds), tm.CPUSeconds, plain.CPUSeconds, pool.CPUSeconds, times(pool.Ratio))
	return b.String(), nil
}

// readingKafkago is "Reading the table"'s kafka-go item.
func readingKafkago(reps *benchReports) (string, error) {
	rs, err := results(reps.bench, "noop", "tidemark over kafkago", "noop", "plain franz-go poll loop")
	if err != nil {
		return "", err
	}
	kgo, plain := rs[0], rs[1]
	cmp, cost := "≥", "nothing"
	if kgo.Ratio < 1 {
		cmp, cost = "<", fmt.Sprintf("%.0f%% of the Reader's rate", 100*(1-kgo.Ratio))
	}
	return fmt.Sprintf("**tidemark over kafka-go %s the kafka-go Reader** (%s): the adapter does not use `Reader` but fetches through `kafka.Client` and hands whole batches over, while the `Reader` hands one message per call through its channels. With the Reader as the baseline, the kafkago adapter costs %s; against the franz loop it reaches %s (the ratio of the two rows' records/s)",
		cmp, times(kgo.Ratio), cost, times(kgo.PerSecond/plain.PerSecond)), nil
}

// readingIO is "Reading the table"'s I/O-bound item.
func readingIO(reps *benchReports) (string, error) {
	rs, err := results(reps.bench, "sleep", "tidemark over franz", "sleep", "tidemark over kafkago", "sleep", "sequential")
	if err != nil {
		return "", err
	}
	franz, kgo, seq := rs[0], rs[1], rs[2]
	apart := math.Ceil(100 * math.Abs(franz.PerSecond-kgo.PerSecond) / max(franz.PerSecond, kgo.PerSecond))
	return fmt.Sprintf("%s the sequential consumer at concurrency %d — the sequential one does %s/s, the theory %s/s; the two adapters' rates (%s and %s records/s) are within %.0f%% of each other",
		times(franz.Ratio), franz.Concurrency, thousands(seq.PerSecond), thousands(franz.Theoretical),
		thousands(franz.PerSecond), thousands(kgo.PerSecond), apart), nil
}

// readingCPU is "Reading the table"'s CPU-bound item.
func readingCPU(reps *benchReports) (string, error) {
	r, err := result(reps.bench, "cpu", "tidemark over franz")
	if err != nil {
		return "", err
	}
	cpus := reps.bench.Machine.CPUs
	work := reps.bench.Config.CPUWork
	if d, err := time.ParseDuration(work); err == nil {
		work = d.Round(time.Microsecond).String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d cores bound any consumer at %d× a sequential one, and the broker takes its share: ", cpus, cpus)
	if r.Ratio > float64(cpus) {
		fmt.Fprintf(&b, "%s sequential is possible because the sequential consumer also waits on its polls and commits", times(r.Ratio))
	} else {
		fmt.Fprintf(&b, "tidemark reached %s sequential", times(r.Ratio))
	}
	fmt.Fprintf(&b, "; tidemark reached %.0f%% of the theoretical %s/s at %s per record", 100*r.OfTheory, thousands(r.Theoretical), spaced(work))
	return b.String(), nil
}

// readingInbox is "Reading the table"'s inbox item's figures.
func readingInbox(reps *benchReports) (string, error) {
	rs, err := results(reps.bench, "inbox", "tidemark+inbox 1/tx", "inbox", "tidemark+inbox Batch")
	if err != nil {
		return "", err
	}
	one, batch := rs[0], rs[1]
	return fmt.Sprintf("%s. Batching commits %.1f records per transaction and reaches %s (%s the records/s of one per transaction)",
		times(one.Ratio), batch.PerTransaction, times(batch.Ratio), times(batch.PerSecond/one.PerSecond)), nil
}

// millions writes a rate in millions: "1.43 M".
func millions(x float64) string { return fmt.Sprintf("%.2f M", x/1e6) }

// adaptersCompare is tidemark over kafka-go against tidemark over franz
// in rep (named file), with the no-op and the sleep handler, by their
// records/s.
func adaptersCompare(rep *Report, file string) (string, error) {
	if rep == nil {
		return "", fmt.Errorf("no %s", file)
	}
	rs, err := results(rep, "noop", "tidemark over franz", "noop", "tidemark over kafkago", "sleep", "tidemark over franz", "sleep", "tidemark over kafkago")
	if err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	c := concurrencyOf(rs[3])
	return fmt.Sprintf("%s tidemark over franz with a no-op handler (%s against %s records/s) and %s with a %s handler at concurrency %d",
		times(rs[1].PerSecond/rs[0].PerSecond), millions(rs[1].PerSecond), millions(rs[0].PerSecond),
		times(rs[3].PerSecond/rs[2].PerSecond), spaced(rep.Config.Sleep), c), nil
}

// adaptersTable is docs/adapters.md's table of adapters.json.
func adaptersTable(reps *benchReports) (string, error) {
	rep := reps.adapters
	if rep == nil {
		return "", errors.New("no adapters.json")
	}
	rs, err := results(rep, "noop", "tidemark over franz", "noop", "tidemark over kafkago", "sleep", "tidemark over franz", "sleep", "tidemark over kafkago")
	if err != nil {
		return "", fmt.Errorf("adapters.json: %w", err)
	}
	var b strings.Builder
	b.WriteString("| handler | franz | kafkago | kafkago ÷ franz |\n|---|---|---|---|")
	for i, label := range []string{
		fmt.Sprintf("no-op, concurrency %d", concurrencyOf(rs[0])),
		fmt.Sprintf("sleep %s, concurrency %d", spaced(rep.Config.Sleep), concurrencyOf(rs[2])),
	} {
		franz, kgo := rs[2*i], rs[2*i+1]
		fmt.Fprintf(&b, "\n| %s | %s rec/s | %s rec/s | %s |", label, thousands(franz.PerSecond), thousands(kgo.PerSecond), times(kgo.PerSecond/franz.PerSecond))
	}
	return b.String(), nil
}

// concurrencyOf is r's concurrency; older reports (adapters.json) name it
// only at the end of the consumer: "tidemark over franz (key order, 64)".
func concurrencyOf(r *Result) int {
	if r.Concurrency > 0 {
		return r.Concurrency
	}
	s := strings.TrimSuffix(r.Consumer, ")")
	n, _ := strconv.Atoi(s[strings.LastIndex(s, " ")+1:])
	return n
}

// scalingRowAt is the row of series at partitions in the scaling report.
func scalingRowAt(sc *Scaling, series string, partitions int) (*ScalingRow, error) {
	for i := range sc.Rows {
		if r := &sc.Rows[i]; r.Series == series && r.Partitions == partitions {
			return r, nil
		}
	}
	return nil, fmt.Errorf("partitions report: no %s row at %d partitions", series, partitions)
}

// scalingRows are the rows of series at the fewest and the most
// partitions.
func scalingRows(reps *benchReports, series string) (first, most *ScalingRow, err error) {
	sc := reps.partitions.Scaling
	if first, err = scalingRowAt(sc, series, slices.Min(sc.Partitions)); err != nil {
		return nil, nil, err
	}
	if most, err = scalingRowAt(sc, series, slices.Max(sc.Partitions)); err != nil {
		return nil, nil, err
	}
	return first, most, nil
}

// partitionsRun is when the partition-scaling report was measured, at
// what load, in how long.
func partitionsRun(reps *benchReports) (string, error) {
	rep := reps.partitions
	at, err := time.Parse(time.RFC3339, rep.At)
	if err != nil {
		return "", fmt.Errorf("the partitions report's at: %w", err)
	}
	load := func(s string) string {
		if f := strings.Fields(s); len(f) > 0 {
			if x, err := strconv.ParseFloat(f[0], 64); err == nil {
				return fmt.Sprintf("%.1f", x)
			}
		}
		return "?"
	}
	return fmt.Sprintf("%s UTC (load average %s before, %s after; %s)",
		at.UTC().Format("2006-01-02 15:04"), load(rep.Machine.LoadBefore), load(rep.Machine.LoadAfter), minutes(rep.Seconds)), nil
}

// partitionsGoal is "Reading it"'s verdict: the goal, the largest median
// growth, and the plain loop's own growth.
func partitionsGoal(reps *benchReports) (string, error) {
	sc := reps.partitions.Scaling
	most := slices.Max(sc.Partitions)
	var growths, plain []float64
	for _, r := range sc.Rows {
		if r.Partitions != most {
			continue
		}
		if r.Baseline != "" {
			growths = append(growths, r.Growth)
		} else {
			plain = append(plain, r.CPUGrowth)
		}
	}
	if len(growths) == 0 || len(plain) == 0 {
		return "", errors.New("partitions report: no growth at the most partitions")
	}
	worst := slices.Max(growths)
	verdict := "met for both adapters and both handlers"
	if worst > sc.Goal {
		verdict = "not met"
	}
	return fmt.Sprintf("By the issue's measure (growth ≤ %s) the goal is %s: no median growth above %s. But the plain loop's own CPU per record grows from %s to %s partitions too (%s)",
		times(sc.Goal), verdict, times(worst), thousands(float64(slices.Min(sc.Partitions))), thousands(float64(most)), oneSpan(plain)), nil
}

// partitionsFranz is "Reading it"'s item on tidemark over franz: what it
// adds to the plain loop's CPU per record, at the fewest and the most
// partitions.
func partitionsFranz(reps *benchReports) (string, error) {
	var add [2][2]float64 // [noop, sleep][first, most]
	for i, h := range []string{"noop", "sleep"} {
		tf, tm, err := scalingRows(reps, "franz-"+h)
		if err != nil {
			return "", err
		}
		bf, bm, err := scalingRows(reps, "baseline-"+h)
		if err != nil {
			return "", err
		}
		add[i] = [2]float64{tf.CPUPerRecord - bf.CPUPerRecord, tm.CPUPerRecord - bm.CPUPerRecord}
	}
	sc := reps.partitions.Scaling
	first, most := thousands(float64(slices.Min(sc.Partitions))), thousands(float64(slices.Max(sc.Partitions)))
	return fmt.Sprintf("it adds %.2f µs per record to the plain loop's CPU at %s partitions and %.2f at %s",
		add[0][1], most, add[0][0], first) +
		fmt.Sprintf(", and the runner's frames in the profile do not grow (below). What grows is franz-go's, which both pay. With the sleep handler it adds %.1f µs at %s against %.1f at %s (%+.0f%%)",
			add[1][1], most, add[1][0], first, 100*(add[1][1]/add[1][0]-1)), nil
}

// partitionsKafkago is "Reading it"'s item on tidemark over kafkago.
func partitionsKafkago(reps *benchReports) (string, error) {
	nf, nm, err := scalingRows(reps, "kafkago-noop")
	if err != nil {
		return "", err
	}
	sf, sm, err := scalingRows(reps, "kafkago-sleep")
	if err != nil {
		return "", err
	}
	ff, fm, err := scalingRows(reps, "franz-sleep")
	if err != nil {
		return "", err
	}
	first := thousands(float64(nf.Partitions))
	return fmt.Sprintf("the CPU per record grows too (%s no-op, %s sleep), but for its own reasons; with the sleep handler its rate drops to %s its rate at %s partitions (%s against %s/s), where the franz adapter holds %s. Single repetitions went up to %s at %s partitions with the no-op handler, %s with the sleep one",
		oneDigit(nm.CPUGrowth), oneDigit(sm.CPUGrowth),
		times(sm.PerSecond/sf.PerSecond), first, thousands(sm.PerSecond), thousands(sf.PerSecond), times(fm.PerSecond/ff.PerSecond),
		strings.TrimSuffix(times(slices.Max(nm.GrowthRuns)), "×"), thousands(float64(nm.Partitions)), strings.TrimSuffix(times(slices.Max(sm.GrowthRuns)), "×")), nil
}

// oneDigit writes a ratio with one decimal: 2.0×.
func oneDigit(x float64) string { return fmt.Sprintf("%.1f×", x) }

// oneSpan is the range of xs with one decimal: "2.0–2.1×", "2.0×".
func oneSpan(xs []float64) string {
	lo, hi := fmt.Sprintf("%.1f", slices.Min(xs)), fmt.Sprintf("%.1f", slices.Max(xs))
	if lo == hi {
		return lo + "×"
	}
	return lo + "–" + hi + "×"
}
