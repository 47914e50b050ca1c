package main

// The share workload: the share-group source (pkg/source/share) against
// the consumer-group source (franz) on the same topics, and against a plain
// franz-go share-group loop that does nothing (runShareLoop).
//
// Two cases:
//
//   - Same topic, C = -concurrency (256): -partitions partitions, a no-op
//     handler draining -share-records records, and a -sleep handler for
//     -run-for. The share source runs with each of -share-sessions
//     sessions (polls of -share-poll records) in one process; the franz
//     source in key-less unordered mode (the only order a share source
//     has). This is the cost of the ack gating: a session polls again only
//     once every record of its last poll is settled (docs/share.md). The
//     no-op case also drains the topic with the plain share loop, polls of
//     -share-poll records at franz-go's share defaults, and (with
//     -share-strict-loop) once more fetching as the share source does:
//     the share source's ceiling on the same protocol, as the plain
//     franz-go loop is the group source's.
//   - The case share groups exist for, more consumers than partitions: a
//     1-partition topic, a -share-queue-sleep handler (50 ms), C =
//     -share-queue-concurrency (8) per process, for -run-for; the share
//     source in each of -share-processes processes at once (1, 2, 4), with
//     each of -share-queue-configs (sessions x records per poll), against
//     one consumer-group member with the same C (a group gives a
//     partition to one member; more members would idle).
//
// Every consumer process is a child of the harness, as for the other
// workloads. The processes of one run are gated: each says ready when its
// first record arrives and holds its handlers until the harness, once all
// are ready (or readyWait after the first was), says go; every window
// starts at go. A run's rate is the records of all its processes over the
// union of their windows (the first go to the end of the last window).
// Each child tracks the
// offsets its handlers finished over its whole run, and the harness adds
// them up: a record that finished in two processes, or twice in one, was
// handled more than once; redelivered counts the handler calls at a
// delivery count above 1. Repetitions take the consumers in turn (in the
// no-op case the plain share loops, then the share source, then the group
// source), each run in a share group or consumer group of its own; a row's
// ratio is the median of its paired ratios against the group source of the
// same repetition, and in the no-op case against the plain share loop too.
// The report's goals are those paired medians for the share source against
// its targets: no-op ÷ the plain share loop, -sleep ÷ the group source.

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
)

// ShareReport is the share workload's report.
type ShareReport struct {
	Repeat int        `json:"repeat"`
	Rows   []ShareRow `json:"rows"`
	// Goals is the share source's paired ratios against its targets.
	Goals []ShareGoal `json:"goals,omitempty"`
}

// ShareGoal is one share-source row's ratio against the baseline a target
// is set for: the median of the paired runs, each run's, and the target.
type ShareGoal struct {
	Case     string    `json:"case"`
	Consumer string    `json:"consumer"`
	Baseline string    `json:"baseline"`
	Ratio    float64   `json:"ratio"`
	Runs     []float64 `json:"runs"`
	Target   float64   `json:"target"`
	Met      bool      `json:"met"`
}

// The share source's targets: with a no-op handler, this share of the
// plain share loop's rate; with the -sleep handler, this share of the
// group source's.
const (
	shareNoopTarget  = 0.8
	shareSleepTarget = 0.9
)

// ShareRow is one consumer (one or several processes) in one case.
type ShareRow struct {
	Case        string `json:"case"`
	Consumer    string `json:"consumer"`
	Source      string `json:"source"` // share, franz, or franz-share (the plain share loop)
	Processes   int    `json:"processes"`
	Sessions    int    `json:"sessions,omitempty"`
	MaxPoll     int    `json:"max_poll_records,omitempty"`
	Concurrency int    `json:"concurrency"`
	Partitions  int    `json:"partitions"`
	Handler     string `json:"handler"`
	// PerSecond is the median over the repetitions; Runs every one's.
	PerSecond float64   `json:"records_per_second"`
	Runs      []float64 `json:"runs"`
	// Theoretical is min(processes × C / L, none for no-op), OfTheory
	// PerSecond's share of it.
	Theoretical float64 `json:"theoretical_per_second,omitempty"`
	OfTheory    float64 `json:"ratio_of_theoretical,omitempty"`
	// Ratio is the median over the repetitions of this row's rate over
	// the group source's (Baseline) in the same repetition.
	Baseline  string    `json:"baseline,omitempty"`
	Ratio     float64   `json:"ratio,omitempty"`
	RatioRuns []float64 `json:"ratio_runs,omitempty"`
	// BareRatio is the same against the plain share loop (BareBaseline),
	// in the no-op case.
	BareBaseline  string    `json:"bare_baseline,omitempty"`
	BareRatio     float64   `json:"ratio_to_bare,omitempty"`
	BareRatioRuns []float64 `json:"ratio_to_bare_runs,omitempty"`
	// Over all repetitions: records handled (distinct offsets), those
	// handled more than once, and handler calls at delivery count > 1.
	Handled     int64 `json:"handled"`
	HandledMore int64 `json:"handled_more_than_once"`
	Redelivered int64 `json:"redelivered"`
	// PerProcess is each repetition's records per process.
	PerProcess [][]int `json:"per_process"`
	// CPUSeconds is the median over the repetitions of all processes'
	// CPU seconds (whole life), PeakRSSMiB the largest process's.
	CPUSeconds float64 `json:"cpu_seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// WindowCPUPerRecord is the median over the repetitions of the
	// processes' CPU in their windows per record handled, µs.
	WindowCPUPerRecord float64 `json:"window_cpu_us_per_record"`
}

// sessionsPoll is a share source's sessions and records per poll.
type sessionsPoll struct{ sessions, poll int }

// parseSessionsPoll reads name's value: comma-separated SxM, S sessions of
// polls of M records each, both positive.
func parseSessionsPoll(name, s string) ([]sessionsPoll, error) {
	var out []sessionsPoll
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		a, m, ok := strings.Cut(f, "x")
		sess, err1 := strconv.Atoi(a)
		poll, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || sess < 1 || poll < 1 {
			return nil, fmt.Errorf("%s: %q is not SxM (sessions x records per poll, both positive, e.g. 4x512)", name, f)
		}
		if sp := (sessionsPoll{sess, poll}); !slices.Contains(out, sp) {
			out = append(out, sp)
		}
	}
	return out, nil
}

// sessionsPollText is what parseSessionsPoll reads back.
func sessionsPollText(sps []sessionsPoll) string {
	fs := make([]string, len(sps))
	for i, sp := range sps {
		fs[i] = fmt.Sprintf("%dx%d", sp.sessions, sp.poll)
	}
	return strings.Join(fs, ",")
}

// shareRun is the figures of one run of one row: all its processes.
type shareRun struct {
	perProcess                 []int // records in each process's window
	records                    int
	seconds                    float64
	handled, more, redelivered int64
	cpu, rss                   float64
	windowCPU                  float64 // the processes' CPU seconds in their windows
}

func (r shareRun) rate() float64 {
	if r.seconds <= 0 {
		return 0
	}
	return float64(r.records) / r.seconds
}

// combine sums the results of the processes of one run (and their usage).
// The window runs from the first process's first record to the last
// process's end.
func combine(results []childResult, usages []usage) (shareRun, error) {
	var r shareRun
	var first, end int64 = math.MaxInt64, math.MinInt64
	var sets [][]partitionRanges
	for i, res := range results {
		if res.FirstNS == 0 || res.EndNS < res.FirstNS {
			return r, fmt.Errorf("process %d of %d reported no window (first %d, end %d)", i+1, len(results), res.FirstNS, res.EndNS)
		}
		if res.Outside > 0 {
			return r, fmt.Errorf("process %d of %d handled %d records beyond the offsets it tracks", i+1, len(results), res.Outside)
		}
		r.records += res.Records
		r.perProcess = append(r.perProcess, res.Records)
		first, end = min(first, res.FirstNS), max(end, res.EndNS)
		r.redelivered += res.Redelivered
		r.windowCPU += res.WindowCPU
		sets = append(sets, res.Seen, res.Again)
		if i < len(usages) {
			r.cpu += usages[i].CPUSeconds
			r.rss = max(r.rss, usages[i].PeakRSSMiB)
		}
	}
	if len(results) == 0 {
		return r, fmt.Errorf("no process")
	}
	r.seconds = time.Duration(end - first).Seconds()
	var err error
	if r.handled, r.more, err = multiplicity(sets...); err != nil {
		return r, err
	}
	return r, nil
}

// shareCase is one case of the workload: its topic and its consumers.
type shareCase struct {
	name       string
	handler    string
	sleep      time.Duration
	partitions int
	records    int // in the topic
	drain      bool
	specs      []childSpec
	processes  []int
	// group and bare are the rows of the group source and of the plain
	// share loop at franz-go's defaults (-1: none): the baselines.
	group, bare int
}

// share runs the share workload.
func (b *bench) share(ctx context.Context) (*ShareReport, error) {
	rep := &ShareReport{Repeat: b.c.repeat}
	conc := b.c.concurrency
	// The most the 5 ms case can do: C/L. The no-op case drains.
	sleepN := int(float64(conc)/b.c.sleep.Seconds()*b.c.runFor.Seconds()*1.1) + 1000
	qConc, qSleep := b.c.shareQConc, b.c.shareQSleep
	most := slices.Max(b.c.shareProcs)
	// The backlog must outlast what the processes can hold, as well as
	// what they can handle: a session acquires up to its poll size at once,
	// and at the source's defaults (4 × 512) two processes could hold every
	// record of a topic sized by the rate alone, leaving the others idle.
	held := 0
	for _, sp := range b.c.shareQConfigs {
		held = max(held, sp.sessions*sp.poll)
	}
	queueN := int(float64(most*qConc)/qSleep.Seconds()*b.c.runFor.Seconds()*1.1) + 1000 + most*held
	if b.c.shareQRecords > 0 {
		queueN = b.c.shareQRecords
	}
	cases := []shareCase{
		{name: fmt.Sprintf("no-op, C=%d, %d partitions, %d records", conc, b.c.partitions, b.c.shareRecords), handler: "noop",
			partitions: b.c.partitions, records: b.c.shareRecords, drain: true},
		{name: fmt.Sprintf("sleep %v, C=%d, %d partitions, %v", b.c.sleep, conc, b.c.partitions, b.c.runFor), handler: "sleep",
			sleep: b.c.sleep, partitions: b.c.partitions, records: sleepN},
		{name: fmt.Sprintf("1 partition, sleep %v, C=%d per process, %v", qSleep, qConc, b.c.runFor), handler: "sleep",
			sleep: qSleep, partitions: 1, records: queueN},
	}
	for i := range cases {
		sc := &cases[i]
		topic, err := b.topicOf(ctx, "share", sc.partitions)
		if err != nil {
			return nil, err
		}
		defer b.drop(topic)
		if err := b.produceTo(ctx, topic, 0, sc.records, b.c.keys); err != nil {
			return nil, err
		}
		mk := func(adapter string, c, sessions, poll int) childSpec {
			consumer := tidemarkC
			if adapter == shareLoop {
				consumer, adapter = shareLoop, ""
			}
			s := b.spec(consumer, adapter, topic, sc.handler, c)
			s.Order, s.Sleep, s.Partitions, s.TrackOffsets, s.Gated = "unordered", sc.sleep, sc.partitions, int64(sc.records), true
			s.ShareSessions, s.SharePoll = sessions, poll
			if sc.drain {
				s.Records = sc.records
			} else {
				s.For, s.Records = b.c.runFor, sc.records
			}
			return s
		}
		sc.bare = -1
		add := func(s childSpec, procs int) {
			sc.specs = append(sc.specs, s)
			sc.processes = append(sc.processes, procs)
		}
		if i < 2 {
			// In run order: the plain share loops, the share source,
			// the group source.
			if sc.drain {
				sc.bare = len(sc.specs)
				add(mk(shareLoop, 0, 0, b.c.sharePoll), 1)
				if b.c.shareStrictLoop {
					s := mk(shareLoop, 0, 0, b.c.sharePoll)
					s.ShareStrict = true
					add(s, 1)
				}
			}
			for _, n := range b.c.shareSessions {
				add(mk("share", conc, n, b.c.sharePoll), 1)
			}
			sc.group = len(sc.specs)
			add(mk("franz", conc, 0, 0), 1)
		} else {
			sc.group = 0
			sc.specs = append(sc.specs, mk("franz", qConc, 0, 0))
			sc.processes = append(sc.processes, 1)
			for _, sp := range b.c.shareQConfigs {
				for _, p := range b.c.shareProcs {
					sc.specs = append(sc.specs, mk("share", qConc, sp.sessions, sp.poll))
					sc.processes = append(sc.processes, p)
				}
			}
		}
	}
	// runs[case][row] holds one shareRun per repetition.
	runs := make([][][]shareRun, len(cases))
	for i := range cases {
		runs[i] = make([][]shareRun, len(cases[i].specs))
	}
	for round := range b.c.repeat {
		for ci, sc := range cases {
			for ri, s := range sc.specs {
				s.Group = b.name("group")
				if b.c.profileDir != "" && sc.processes[ri] == 1 {
					s.CPUProfile = filepath.Join(b.c.profileDir, fmt.Sprintf("share-%s-%s-r%d.pprof", sc.handler, shareSlug(s), round+1))
				}
				r, err := b.gatedRun(ctx, s, sc.processes[ri])
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", sc.name, shareLabel(s, sc.processes[ri]), err)
				}
				runs[ci][ri] = append(runs[ci][ri], r)
				b.logf("%-58s %7d records in %6.2fs %9.0f/s  handled %d, more than once %d, redelivered %d  (%.1f CPU s, %.2f µs/record in the window)",
					shareLabel(s, sc.processes[ri]), r.records, r.seconds, r.rate(), r.handled, r.more, r.redelivered, r.cpu, r.cpuPerRecord())
			}
		}
	}
	for ci, sc := range cases {
		for ri, s := range sc.specs {
			row := shareRowOf(sc, s, sc.processes[ri], runs[ci][ri])
			if ri != sc.group {
				row.against(shareLabel(sc.specs[sc.group], 1), runs[ci][ri], runs[ci][sc.group])
			}
			if sc.bare >= 0 && ri != sc.bare && ri != sc.group {
				row.againstBare(shareLabel(sc.specs[sc.bare], 1), runs[ci][ri], runs[ci][sc.bare])
			}
			if s.Adapter == "share" && ci < 2 {
				if g, ok := row.goal(); ok {
					rep.Goals = append(rep.Goals, g)
				}
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep, nil
}

// goal is a share-source row's ratio against its target: the plain share
// loop's rate with a no-op handler, the group source's with the sleep one.
func (row ShareRow) goal() (ShareGoal, bool) {
	g := ShareGoal{Case: row.Case, Consumer: row.Consumer}
	switch {
	case row.Handler == "noop" && row.BareBaseline != "":
		g.Baseline, g.Ratio, g.Runs, g.Target = row.BareBaseline, row.BareRatio, row.BareRatioRuns, shareNoopTarget
	case row.Handler == "sleep" && row.Baseline != "":
		g.Baseline, g.Ratio, g.Runs, g.Target = row.Baseline, row.Ratio, row.RatioRuns, shareSleepTarget
	default:
		return g, false
	}
	g.Met = g.Ratio >= g.Target
	return g, true
}

func (r shareRun) cpuPerRecord() float64 {
	if r.records <= 0 {
		return 0
	}
	return 1e6 * r.windowCPU / float64(r.records)
}

// shareSlug names a consumer in a profile's file name.
func shareSlug(s childSpec) string {
	switch {
	case s.Consumer == shareLoop && s.ShareStrict:
		return "loop-strict"
	case s.Consumer == shareLoop:
		return "loop"
	case s.Adapter == "share":
		return fmt.Sprintf("share-s%d-m%d", s.ShareSessions, s.SharePoll)
	}
	return s.Adapter
}

// readyWait is how long a run waits for its other processes' first records
// once one process has its first: a gated process holds what it acquired,
// so one that has nothing may get nothing until go (at the share source's
// defaults, 4 sessions of 512 records, on one partition, the others'
// sessions can hold every record the broker lets a share-partition have
// in flight, group.share.partition.max.record.locks, 2000 by default).
const readyWait = 10 * time.Second

// gatedRun starts procs children of spec, waits until every one has its
// first record (or readyWait after the first did), lets them all go and
// combines their results.
func (b *bench) gatedRun(ctx context.Context, spec childSpec, procs int) (shareRun, error) {
	results, usages := make([]childResult, procs), make([]usage, procs)
	readies := make([]chan struct{}, procs)
	start := make(chan struct{})
	g, gctx := errgroup.WithContext(ctx)
	for i := range procs {
		readies[i] = make(chan struct{})
		g.Go(func() error {
			var err error
			results[i], usages[i], err = runGatedChild(gctx, spec, readies[i], start)
			if err != nil && procs > 1 {
				err = fmt.Errorf("process %d of %d: %w", i+1, procs, err)
			}
			return err
		})
	}
	g.Go(func() error {
		defer close(start)
		return awaitReady(gctx, readies, readyWait, func(missing int) {
			b.logf("%d of %d processes had no record %v after the first had one: go", missing, procs, readyWait)
		})
	})
	if err := g.Wait(); err != nil {
		return shareRun{}, err
	}
	return combine(results, usages)
}

// awaitReady returns once every one of readies is closed, in any order, or
// wait after the first was closed (calling late with how many were not),
// or when ctx is done. It always returns nil: a child's error is the one
// to report.
func awaitReady(ctx context.Context, readies []chan struct{}, wait time.Duration, late func(missing int)) error {
	got := make(chan struct{}, len(readies))
	stop := make(chan struct{})
	defer close(stop)
	for _, r := range readies {
		go func() {
			select {
			case <-r:
				got <- struct{}{}
			case <-stop:
			}
		}()
	}
	var timeout <-chan time.Time
	for n := 0; n < len(readies); {
		select {
		case <-got:
			n++
			if timeout == nil {
				t := time.NewTimer(wait)
				defer t.Stop()
				timeout = t.C
			}
		case <-timeout:
			late(len(readies) - n)
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

func shareLabel(s childSpec, procs int) string {
	if s.Consumer == shareLoop {
		if s.ShareStrict {
			return fmt.Sprintf("plain share loop (franz-go), polls of %d, strict", s.SharePoll)
		}
		return fmt.Sprintf("plain share loop (franz-go), polls of %d", s.SharePoll)
	}
	if s.Adapter != "share" {
		return fmt.Sprintf("consumer group (franz), 1 member, C=%d", s.Concurrency)
	}
	sess, poll := s.ShareSessions, s.SharePoll
	p := "1 process"
	if procs > 1 {
		p = fmt.Sprintf("%d processes", procs)
	}
	return fmt.Sprintf("share, %s, S=%d, poll %d, C=%d each", p, sess, poll, s.Concurrency)
}

func shareRowOf(sc shareCase, s childSpec, procs int, runs []shareRun) ShareRow {
	row := ShareRow{Case: sc.name, Consumer: shareLabel(s, procs), Source: s.Adapter, Processes: procs, Concurrency: s.Concurrency,
		Partitions: sc.partitions, Handler: sc.handler}
	switch {
	case s.Adapter == "share":
		row.Sessions, row.MaxPoll = s.ShareSessions, s.SharePoll
	case s.Consumer == shareLoop:
		row.Source, row.MaxPoll = "franz-share", s.SharePoll
	}
	var cpu, perRecord []float64
	for _, r := range runs {
		row.Runs = append(row.Runs, r.rate())
		row.PerProcess = append(row.PerProcess, r.perProcess)
		cpu = append(cpu, r.cpu)
		perRecord = append(perRecord, r.cpuPerRecord())
		row.Handled += r.handled
		row.HandledMore += r.more
		row.Redelivered += r.redelivered
		row.PeakRSSMiB = max(row.PeakRSSMiB, r.rss)
	}
	row.PerSecond, row.CPUSeconds, row.WindowCPUPerRecord = median(row.Runs), median(cpu), median(perRecord)
	if sc.sleep > 0 {
		row.Theoretical = float64(procs*s.Concurrency) / sc.sleep.Seconds()
		row.OfTheory = row.PerSecond / row.Theoretical
	}
	return row
}

// against sets the row's ratio: the median of its runs' rates over the
// baseline's in the same repetition.
func (row *ShareRow) against(baseline string, own, base []shareRun) {
	if ratios := pairedRatios(own, base); len(ratios) > 0 {
		row.Baseline, row.Ratio, row.RatioRuns = baseline, median(ratios), ratios
	}
}

// againstBare sets the row's ratio against the plain share loop, as
// against does against the group source.
func (row *ShareRow) againstBare(baseline string, own, base []shareRun) {
	if ratios := pairedRatios(own, base); len(ratios) > 0 {
		row.BareBaseline, row.BareRatio, row.BareRatioRuns = baseline, median(ratios), ratios
	}
}

// pairedRatios is own's rate over base's, repetition by repetition, where
// base has one.
func pairedRatios(own, base []shareRun) []float64 {
	var ratios []float64
	for i := range min(len(own), len(base)) {
		if b := base[i].rate(); b > 0 {
			ratios = append(ratios, own[i].rate()/b)
		}
	}
	return ratios
}

// processSpread is the fewest and the most records one process handled in
// a window, over every repetition.
func (row ShareRow) processSpread() (lo, hi int) {
	lo = math.MaxInt
	for _, run := range row.PerProcess {
		for _, n := range run {
			lo, hi = min(lo, n), max(hi, n)
		}
	}
	if lo == math.MaxInt {
		lo = 0
	}
	return lo, hi
}

// printShare prints the share workload's table.
func printShare(w io.Writer, sr *ShareReport) {
	fmt.Fprintf(w, "\nshare: the share source against the consumer-group source (franz) and the plain share loop, %d repetitions\n", sr.Repeat)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tconsumer\trecords/s\tof theory\t÷ group (runs)\t÷ share loop (runs)\tper process min–max\thandled\t>1×\tredelivered\tCPU s\tCPU µs/record\tRSS MiB\t")
	last := ""
	for _, r := range sr.Rows {
		c := r.Case
		if c == last {
			c = ""
		}
		last = r.Case
		theory, ratio := "", "baseline"
		if r.Theoretical > 0 {
			theory = fmt.Sprintf("%.0f%% of %.0f", 100*r.OfTheory, r.Theoretical)
		}
		if r.Baseline != "" {
			ratio = ratioRuns(r.Ratio, r.RatioRuns)
		}
		bare := ""
		switch {
		case r.BareBaseline != "":
			bare = ratioRuns(r.BareRatio, r.BareRatioRuns)
		case r.Source == "franz-share" && r.Baseline != "":
			bare = "baseline"
		}
		lo, hi := r.processSpread()
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%d–%d\t%d\t%d\t%d\t%.1f\t%.2f\t%.0f\t\n", c, r.Consumer, r.PerSecond, theory, ratio, bare,
			lo, hi, r.Handled, r.HandledMore, r.Redelivered, r.CPUSeconds, r.WindowCPUPerRecord, r.PeakRSSMiB)
	}
	tw.Flush()
	if len(sr.Goals) == 0 {
		return
	}
	fmt.Fprintf(w, "\nshare goals, medians of %d paired runs:\n", sr.Repeat)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, g := range sr.Goals {
		met := "not met"
		if g.Met {
			met = "met"
		}
		fmt.Fprintf(tw, "%s\t%s\t÷ %s\t%s\tgoal ≥ %.2f×: %s\t\n", g.Case, g.Consumer, g.Baseline, ratioRuns(g.Ratio, g.Runs), g.Target, met)
	}
	tw.Flush()
}

// ratioRuns formats a median ratio and its runs: "0.47× (0.41 0.47 0.53)".
func ratioRuns(ratio float64, runs []float64) string {
	rs := make([]string, len(runs))
	for i, x := range runs {
		rs[i] = fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2f× (%s)", ratio, strings.Join(rs, " "))
}
