package main

// The share workload: the share-group source (pkg/source/share) against
// the consumer-group source (franz) on the same topics.
//
// Two cases:
//
//   - Same topic, C = -concurrency (256): -partitions partitions, a no-op
//     handler draining -share-records records, and a -sleep handler for
//     -run-for. The share source runs with each of -share-sessions
//     sessions (polls of -share-poll records) in one process; the franz
//     source in key-less unordered mode (the only order a share source
//     has). This is the cost of the ack gating: a session polls again only
//     once every record of its last poll is settled (docs/share.md).
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
// delivery count above 1. Repetitions take the consumers in turn; a row's
// ratio is the median of its paired ratios against the group source of the
// same repetition.

import (
	"context"
	"fmt"
	"io"
	"math"
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
}

// ShareRow is one consumer (one or several processes) in one case.
type ShareRow struct {
	Case        string `json:"case"`
	Consumer    string `json:"consumer"`
	Source      string `json:"source"` // share or franz
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
			s := b.spec(tidemarkC, adapter, topic, sc.handler, c)
			s.Order, s.Sleep, s.Partitions, s.TrackOffsets, s.Gated = "unordered", sc.sleep, sc.partitions, int64(sc.records), true
			s.ShareSessions, s.SharePoll = sessions, poll
			if sc.drain {
				s.Records = sc.records
			} else {
				s.For, s.Records = b.c.runFor, sc.records
			}
			return s
		}
		if i < 2 {
			sc.specs = append(sc.specs, mk("franz", conc, 0, 0))
			sc.processes = append(sc.processes, 1)
			for _, n := range b.c.shareSessions {
				sc.specs = append(sc.specs, mk("share", conc, n, b.c.sharePoll))
				sc.processes = append(sc.processes, 1)
			}
		} else {
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
	for range b.c.repeat {
		for ci, sc := range cases {
			for ri, s := range sc.specs {
				s.Group = b.name("group")
				r, err := b.gatedRun(ctx, s, sc.processes[ri])
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", sc.name, shareLabel(s, sc.processes[ri]), err)
				}
				runs[ci][ri] = append(runs[ci][ri], r)
				b.logf("%-58s %7d records in %6.2fs %9.0f/s  handled %d, more than once %d, redelivered %d  (%.1f CPU s)",
					shareLabel(s, sc.processes[ri]), r.records, r.seconds, r.rate(), r.handled, r.more, r.redelivered, r.cpu)
			}
		}
	}
	for ci, sc := range cases {
		for ri, s := range sc.specs {
			row := shareRowOf(sc, s, sc.processes[ri], runs[ci][ri])
			if ri > 0 {
				row.against(shareLabel(sc.specs[0], 1), runs[ci][ri], runs[ci][0])
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep, nil
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
	if s.Adapter == "share" {
		row.Sessions, row.MaxPoll = s.ShareSessions, s.SharePoll
	}
	var cpu []float64
	for _, r := range runs {
		row.Runs = append(row.Runs, r.rate())
		row.PerProcess = append(row.PerProcess, r.perProcess)
		cpu = append(cpu, r.cpu)
		row.Handled += r.handled
		row.HandledMore += r.more
		row.Redelivered += r.redelivered
		row.PeakRSSMiB = max(row.PeakRSSMiB, r.rss)
	}
	row.PerSecond, row.CPUSeconds = median(row.Runs), median(cpu)
	if sc.sleep > 0 {
		row.Theoretical = float64(procs*s.Concurrency) / sc.sleep.Seconds()
		row.OfTheory = row.PerSecond / row.Theoretical
	}
	return row
}

// against sets the row's ratio: the median of its runs' rates over the
// baseline's in the same repetition.
func (row *ShareRow) against(baseline string, own, base []shareRun) {
	var ratios []float64
	for i := range min(len(own), len(base)) {
		if b := base[i].rate(); b > 0 {
			ratios = append(ratios, own[i].rate()/b)
		}
	}
	if len(ratios) == 0 {
		return
	}
	row.Baseline, row.Ratio, row.RatioRuns = baseline, median(ratios), ratios
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
	fmt.Fprintf(w, "\nshare: the share source against the consumer-group source (franz), %d repetitions\n", sr.Repeat)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tconsumer\trecords/s\tof theory\t÷ group (runs)\tper process min–max\thandled\t>1×\tredelivered\tCPU s\tRSS MiB\t")
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
			rs := make([]string, len(r.RatioRuns))
			for i, x := range r.RatioRuns {
				rs[i] = fmt.Sprintf("%.2f", x)
			}
			ratio = fmt.Sprintf("%.2f× (%s)", r.Ratio, strings.Join(rs, " "))
		}
		lo, hi := r.processSpread()
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%d–%d\t%d\t%d\t%d\t%.1f\t%.0f\t\n", c, r.Consumer, r.PerSecond, theory, ratio,
			lo, hi, r.Handled, r.HandledMore, r.Redelivered, r.CPUSeconds, r.PeakRSSMiB)
	}
	tw.Flush()
}
