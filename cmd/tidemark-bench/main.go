// Command tidemark-bench measures tidemark against baselines on a real
// Kafka broker (and PostgreSQL for the inbox), in one run on the same
// topics, and prints a table, writes a JSON report and draws the scaling
// curves as PNGs. Every tidemark figure is given as a ratio against a
// baseline measured in the same run, because the machines it runs on are
// shared and noisy.
//
// Each consumer — tidemark and every baseline alike — runs in a child
// process of the harness (the same binary, started again), so that its peak
// RSS and CPU seconds are its own (see child.go). Throughput is timed from
// the first record a consumer handles to the last, so the group join and
// the first fetch, which differ between clients, are outside every window.
// Latency (produce → handler start) is measured separately, in a paced
// phase on a fresh topic while the consumer is already running, at
// -latency-load of the rate it reached (at most -latency-max-rate).
//
// Workloads (-workload, comma-separated):
//
//	noop         -records records: the plain franz-go poll loop and the plain
//	             kafka-go Reader loop (the fetch ceilings) against tidemark
//	             over the franz and kafkago adapters with a no-op handler.
//	sleep        a handler sleeping -sleep: the sequential consumer against
//	             tidemark at -concurrency, and min(C/L, no-op rate).
//	cpu          -cpu-work of SHA-256 per record: sequential against tidemark.
//	inbox        pkg/inbox, one record per transaction and Batch(n), with both
//	             effect shapes, against a single-row INSERT per transaction
//	             loop on the same server: the bed's, and (-durable) one the
//	             bench starts with fsync and synchronous_commit on, its data
//	             on disk (-durable-dir); round trips per record for each.
//	concurrency  the scaling curve against -curve-concurrency (sleep handler).
//	keys         the scaling curve against -curve-keys in key order.
//	partitions   CPU per record against the partition count: one topic per
//	             -partition-counts, each of -partition-records records;
//	             the plain franz-go loop, with the fetch settings of
//	             tidemark's franz adapter, against tidemark over both
//	             adapters with a no-op and a -sleep handler, in turn,
//	             -partition-repeat times (partitions.go).
//	share        the share-group source (pkg/source/share) against the
//	             consumer-group source (franz): no-op and -sleep handlers at
//	             -concurrency on one topic, with -share-sessions sessions, the
//	             no-op one against the plain franz-go share loop too; and
//	             a 1-partition topic, -share-queue-sleep handlers,
//	             -share-queue-concurrency per process, in -share-processes
//	             processes at once, against one group member (share.go).
//	adapters     noop and sleep (both adapters); curves: concurrency and keys;
//	all          every workload.
//
// Usage:
//
//	scripts/testbed up && source .testbed/env
//	go run ./cmd/tidemark-bench -workload all -json docs/bench/bench.json -plots docs/bench
//	go run ./cmd/tidemark-bench -replot docs/bench/bench.json -plots docs/bench
//	go run ./cmd/tidemark-bench -write-docs .   # the figures of docs/*.md from docs/bench/*.json
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

type config struct {
	brokers          []string
	dsn              string
	workloads        []string
	records          int
	partitions       int
	size             int
	keys             int
	concurrency      int
	noopConc         int
	order            string
	adapters         []string
	sleep            time.Duration
	runFor           time.Duration
	cpuWork          time.Duration
	hashRounds       int
	hashTook         time.Duration
	inboxRecords     int
	inboxBatch       int
	inboxWait        time.Duration
	inboxDurable     bool
	durableDir       string
	latencyFor       time.Duration
	latencyMax       float64
	latencyLoad      float64
	repeat           int
	high             int
	partBytes        int
	curveConc        []int
	curveKeys        []int
	partCounts       []int
	partRecords      int
	partSleepRecords int
	partRepeat       int
	partHandlers     []string
	shareRecords     int
	shareSessions    []int
	sharePoll        int
	shareProcs       []int
	shareQSleep      time.Duration
	shareQConc       int
	shareQConfigs    []sessionsPoll
	shareQRecords    int
	shareStrictLoop  bool
	profileDir       string
	cpuProfile       string
	jsonOut          string
	plotsDir         string
	replot           string
	writeDocs        string
	verbose          bool
}

// workloadOrder is the order workloads run in: noop first, because its
// tidemark rates cap the theoretical lines of the others.
var workloadOrder = []string{"noop", "sleep", "cpu", "inbox", "concurrency", "keys", "partitions", "share"}

func main() {
	if len(os.Args) > 2 && os.Args[1] == childFlag {
		os.Exit(childMain(os.Args[2]))
	}
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		fail(err)
	}
	if c.writeDocs != "" {
		if err := writeDocs(c.writeDocs); err != nil {
			fail(err)
		}
		return
	}
	if c.replot != "" {
		rep, err := readReport(c.replot)
		if err != nil {
			fail(err)
		}
		if err := drawCurves(rep, c.plotsDir); err != nil {
			fail(err)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tidemark-bench:", err)
	os.Exit(1)
}

const bedHint = "start the test bed: scripts/testbed up && source .testbed/env"

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("tidemark-bench", flag.ContinueOnError)
	brokers := fs.String("brokers", os.Getenv("TIDEMARK_KAFKA_BROKERS"), "Kafka seed brokers, comma-separated (default $TIDEMARK_KAFKA_BROKERS)")
	fs.StringVar(&c.dsn, "dsn", os.Getenv("TIDEMARK_PG_DSN"), "PostgreSQL for the inbox workload (default $TIDEMARK_PG_DSN)")
	workloads := fs.String("workload", "all", "comma-separated: noop, sleep, cpu, inbox, concurrency, keys, partitions, share; or adapters, curves, all")
	fs.IntVar(&c.records, "records", 2_000_000, "records of the noop workload")
	fs.IntVar(&c.partitions, "partitions", 12, "partitions of every topic")
	fs.IntVar(&c.size, "size", 100, "record value size in bytes (at least 16)")
	fs.IntVar(&c.keys, "keys", 10_000, "distinct keys (all but the keys curve)")
	fs.IntVar(&c.concurrency, "concurrency", 256, "tidemark's concurrency for sleep, inbox and the keys curve")
	fs.IntVar(&c.noopConc, "noop-concurrency", 64, "tidemark's concurrency for noop and cpu")
	fs.StringVar(&c.order, "order", "key", "tidemark's ordering: key, partition or unordered (the keys curve is always key)")
	adapters := fs.String("adapter", "franz,kafkago", "tidemark's adapters, comma-separated: franz, kafkago; the first one runs the inbox and the curves")
	fs.DurationVar(&c.sleep, "sleep", 5*time.Millisecond, "handler latency L of the sleep workload and the curves")
	fs.DurationVar(&c.runFor, "run-for", 4*time.Second, "how long each time-bounded run lasts (sleep, cpu, each curve point)")
	fs.DurationVar(&c.runFor, "sleep-records-seconds", 4*time.Second, "old name of -run-for")
	fs.DurationVar(&c.runFor, "sequential-for", 4*time.Second, "old name of -run-for")
	fs.DurationVar(&c.cpuWork, "cpu-work", 50*time.Microsecond, "CPU per record of the cpu workload (SHA-256 rounds calibrated to it at start)")
	fs.IntVar(&c.inboxRecords, "inbox-records", 20_000, "records of the inbox workload")
	fs.IntVar(&c.inboxBatch, "inbox-batch", 32, "inbox.Batch of the batched inbox run")
	fs.DurationVar(&c.inboxWait, "inbox-batch-wait", 200*time.Microsecond, "inbox.BatchWait of the batched inbox run")
	fs.BoolVar(&c.inboxDurable, "durable", true, "run the inbox workload on a PostgreSQL of the bench's own too, with fsync and synchronous_commit on")
	fs.StringVar(&c.durableDir, "durable-dir", filepath.Join(cmp.Or(os.Getenv("TIDEMARK_TESTBED_DIR"), ".testbed"), "bench-pg"),
		"where the durable server keeps its data: on disk, not tmpfs (a directory the postgres user can reach when run as root)")
	fs.DurationVar(&c.latencyFor, "latency-for", 2*time.Second, "length of each consumer's paced latency phase (0: no latency)")
	fs.Float64Var(&c.latencyMax, "latency-max-rate", 20_000, "highest records/s of the paced latency phase")
	fs.Float64Var(&c.latencyLoad, "latency-load", 0.3, "rate of the paced latency phase as a share of the consumer's measured rate")
	fs.IntVar(&c.repeat, "repeat", 1, "runs of each consumer of noop, sleep, cpu and inbox, taken in turn (the median is kept; curve points run once)")
	fs.IntVar(&c.high, "high", 10_000, "tidemark's per-partition high water mark in records (low is half)")
	fs.IntVar(&c.partBytes, "fetch-partition-bytes", 0, "kgo.FetchMaxPartitionBytes given to tidemark's franz adapter, which now replaces it with the size it derives from runner.MaxBufferedBytes: no effect, kept for old command lines")
	curveConc := fs.String("curve-concurrency", "1,4,16,64,256,1024", "concurrencies of the concurrency curve")
	curveKeys := fs.String("curve-keys", "1,10,100,1000,10000,100000", "key counts of the keys curve")
	partCounts := fs.String("partition-counts", "12,120,1200", "partition counts of the partitions workload (one topic each)")
	fs.IntVar(&c.partRecords, "partition-records", 1_000_000, "records of each no-op topic of the partitions workload (the same for every count)")
	fs.IntVar(&c.partSleepRecords, "partition-sleep-records", 150_000, "records of each sleep topic of the partitions workload (the same for every count)")
	partHandlers := fs.String("partition-handlers", "noop,sleep", "handlers of the partitions workload, comma-separated: noop (at -noop-concurrency), sleep (-sleep, at -concurrency)")
	fs.IntVar(&c.shareRecords, "share-records", 300_000, "records of the share workload's no-op topic")
	shareSessions := fs.String("share-sessions", "1,4", "share.Sessions of the share workload's rows at -concurrency, comma-separated")
	fs.IntVar(&c.sharePoll, "share-poll", 512, "share.MaxPollRecords of the share workload's rows at -concurrency")
	shareProcs := fs.String("share-processes", "1,2,4", "share-group processes of the share workload's 1-partition case, comma-separated")
	fs.DurationVar(&c.shareQSleep, "share-queue-sleep", 50*time.Millisecond, "handler latency of the share workload's 1-partition case")
	fs.IntVar(&c.shareQConc, "share-queue-concurrency", 8, "concurrency per process (and of the group member) in the share workload's 1-partition case")
	shareQConfigs := fs.String("share-queue-configs", "4x512,2x8", "share.Sessions x share.MaxPollRecords of the share workload's 1-partition case, comma-separated; each runs with every -share-processes")
	fs.IntVar(&c.shareQRecords, "share-queue-records", 0, "records of the share workload's 1-partition topic (0: enough for the most processes at their theoretical rate for -run-for, +10%, +1000, plus what they can hold: processes × sessions × poll)")
	fs.BoolVar(&c.shareStrictLoop, "share-strict-loop", true, "in the share workload's no-op case, run the plain share loop a second time fetching as the share source does (-share-poll records per fetch, strict, a fetch only while a poll runs)")
	fs.IntVar(&c.partRepeat, "partition-repeat", 5, "repetitions of the partitions workload, every count and consumer in turn (-repeat does not apply)")
	fs.StringVar(&c.profileDir, "profile-dir", "", "write a CPU profile of every child of the partitions workload, and of every one-process run of the share workload, into this directory, one file per child (go tool pprof merges several)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of tidemark's first no-op run to this file (TIDEMARK_BENCH_TRACE=file adds an execution trace)")
	fs.StringVar(&c.jsonOut, "json", "", "write the report as JSON to this file")
	fs.StringVar(&c.plotsDir, "plots", "", "draw the curves as concurrency.png, keys.png and partitions.png into this directory")
	fs.StringVar(&c.replot, "replot", "", "draw the plots of this JSON report (with -plots) and run nothing")
	fs.StringVar(&c.writeDocs, "write-docs", "", "rewrite the generated figures of docs/performance.md and docs/operations.md under this `root` (the checkout) from its docs/bench/*.json, and run nothing")
	fs.BoolVar(&c.verbose, "v", true, "print each run as it ends")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.writeDocs != "" {
		return c, nil
	}
	if c.replot != "" {
		if c.plotsDir == "" {
			return c, errors.New("-replot needs -plots DIR")
		}
		return c, nil
	}
	for b := range strings.SplitSeq(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.brokers = append(c.brokers, b)
		}
	}
	if len(c.brokers) == 0 {
		return c, errors.New("no brokers: pass -brokers or set TIDEMARK_KAFKA_BROKERS (" + bedHint + ")")
	}
	var err error
	if c.workloads, err = expandWorkloads(*workloads); err != nil {
		return c, err
	}
	for a := range strings.SplitSeq(*adapters, ",") {
		if a != "franz" && a != "kafkago" {
			return c, fmt.Errorf("-adapter %q: want franz, kafkago or both, comma-separated", a)
		}
		c.adapters = append(c.adapters, a)
	}
	if _, err := parseOrder(c.order); err != nil {
		return c, err
	}
	if c.curveConc, err = parseInts("-curve-concurrency", *curveConc); err != nil {
		return c, err
	}
	if c.curveKeys, err = parseInts("-curve-keys", *curveKeys); err != nil {
		return c, err
	}
	if c.partCounts, err = parseInts("-partition-counts", *partCounts); err != nil {
		return c, err
	}
	slices.Sort(c.partCounts)
	c.partCounts = slices.Compact(c.partCounts)
	if c.shareSessions, err = parseInts("-share-sessions", *shareSessions); err != nil {
		return c, err
	}
	if c.shareProcs, err = parseInts("-share-processes", *shareProcs); err != nil {
		return c, err
	}
	if c.shareQConfigs, err = parseSessionsPoll("-share-queue-configs", *shareQConfigs); err != nil {
		return c, err
	}
	for h := range strings.SplitSeq(*partHandlers, ",") {
		if h = strings.TrimSpace(h); h != "noop" && h != "sleep" {
			return c, fmt.Errorf("-partition-handlers %q: want noop, sleep or both, comma-separated", h)
		}
		if !slices.Contains(c.partHandlers, h) {
			c.partHandlers = append(c.partHandlers, h)
		}
	}
	switch {
	case c.size < stampLen+4:
		return c, fmt.Errorf("-size %d: at least %d bytes (the latency stamp lives in the value)", c.size, stampLen+4)
	case c.records < 1, c.partitions < 1, c.keys < 1, c.concurrency < 1, c.noopConc < 1, c.repeat < 1, c.inboxRecords < 1,
		c.partRecords < 1, c.partSleepRecords < 1, c.partRepeat < 1:
		return c, errors.New("-records, -partitions, -keys, -concurrency, -noop-concurrency, -repeat, -inbox-records, -partition-records, -partition-sleep-records and -partition-repeat must be positive")
	case c.shareQRecords < 0:
		return c, errors.New("-share-queue-records must not be negative")
	case c.shareRecords < 1, c.sharePoll < 1, c.shareQConc < 1:
		return c, errors.New("-share-records, -share-poll and -share-queue-concurrency must be positive")
	case c.shareQSleep <= 0:
		return c, errors.New("-share-queue-sleep must be positive")
	case c.sleep <= 0 || c.runFor <= 0 || c.cpuWork <= 0:
		return c, errors.New("-sleep, -run-for and -cpu-work must be positive")
	case c.latencyLoad <= 0 || c.latencyLoad >= 1:
		return c, errors.New("-latency-load must be between 0 and 1")
	}
	if slices.Contains(c.workloads, "inbox") && c.dsn == "" {
		return c, errors.New("the inbox workload needs PostgreSQL: pass -dsn or set TIDEMARK_PG_DSN (" + bedHint + ")")
	}
	return c, nil
}

// expandWorkloads turns -workload into workloads in workloadOrder.
func expandWorkloads(s string) ([]string, error) {
	want := map[string]bool{}
	for w := range strings.SplitSeq(s, ",") {
		switch w = strings.TrimSpace(w); w {
		case "all":
			for _, x := range workloadOrder {
				want[x] = true
			}
		case "adapters":
			want["noop"], want["sleep"] = true, true
		case "curves":
			want["concurrency"], want["keys"] = true, true
		default:
			if !slices.Contains(workloadOrder, w) {
				return nil, fmt.Errorf("-workload %q: want %s, adapters, curves or all", w, strings.Join(workloadOrder, ", "))
			}
			want[w] = true
		}
	}
	var out []string
	for _, w := range workloadOrder {
		if want[w] {
			out = append(out, w)
		}
	}
	return out, nil
}

func parseInts(name, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseOrder(s string) (runner.Ordering, error) {
	switch s {
	case "key":
		return runner.KeyOrder, nil
	case "partition":
		return runner.PartitionOrder, nil
	case "unordered":
		return runner.Unordered, nil
	}
	return 0, fmt.Errorf("-order %q: want key, partition or unordered", s)
}

// run runs the selected workloads, prints the table and writes the report.
func run(ctx context.Context, c config) error {
	start := time.Now()
	if err := pingKafka(ctx, c.brokers); err != nil {
		return err
	}
	if slices.Contains(c.workloads, "cpu") {
		c.hashRounds, c.hashTook = calibrate(c.cpuWork)
	}
	b, err := newBench(c)
	if err != nil {
		return err
	}
	defer b.close()
	rep := &Report{At: start.UTC().Format(time.RFC3339), Machine: machine(), Command: os.Args, Config: c.params()}
	for _, w := range c.workloads {
		fmt.Printf("%s …\n", w)
		var rows []Result
		var cv Curve
		var err error
		switch w {
		case "noop":
			rows, err = b.noop(ctx)
		case "sleep":
			rows, err = b.sleepy(ctx)
		case "cpu":
			rows, err = b.cpu(ctx)
		case "inbox":
			var servers []Server
			rows, servers, err = b.inbox(ctx)
			rep.Servers = append(rep.Servers, servers...)
		case "concurrency":
			cv, err = b.concurrencyCurve(ctx)
		case "keys":
			cv, err = b.keysCurve(ctx)
		case "partitions":
			rep.Scaling, err = b.partitionScaling(ctx)
		case "share":
			rep.Share, err = b.share(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", w, err)
		}
		rep.Results = append(rep.Results, rows...)
		if cv.Name != "" {
			rep.Curves = append(rep.Curves, cv)
		}
	}
	rep.Machine.LoadAfter = loadAverage()
	rep.Seconds = time.Since(start).Seconds()
	printReport(os.Stdout, rep)
	if c.jsonOut != "" {
		if err := writeReport(c.jsonOut, rep); err != nil {
			return err
		}
	}
	if c.plotsDir != "" && (len(rep.Curves) > 0 || rep.Scaling != nil) {
		if err := drawCurves(rep, c.plotsDir); err != nil {
			return err
		}
	}
	return nil
}

// pingKafka fails with a hint when no broker answers.
func pingKafka(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).ListBrokers(ctx); err != nil {
		return fmt.Errorf("no Kafka broker answers at %s: %w; %s", strings.Join(brokers, ","), err, bedHint)
	}
	return nil
}

func (c config) params() Params {
	return Params{Workloads: c.workloads, Records: c.records, Partitions: c.partitions, Size: c.size, Keys: c.keys,
		Concurrency: c.concurrency, NoopConcurrency: c.noopConc, Order: c.order, Adapters: c.adapters,
		Sleep: c.sleep.String(), RunFor: c.runFor.String(), CPUWork: c.hashTook.String(), HashRounds: c.hashRounds,
		InboxRecords: c.inboxRecords, InboxBatch: c.inboxBatch, InboxWait: c.inboxWait.String(), InboxDurable: c.inboxDurable,
		LatencyFor: c.latencyFor.String(), LatencyMaxRate: c.latencyMax, LatencyLoad: c.latencyLoad, Repeat: c.repeat, HighWaterMark: c.high,
		CurveConcurrency: c.curveConc, CurveKeys: c.curveKeys, PartitionCounts: c.partCounts, PartitionRecords: c.partRecords, PartitionSleepRecords: c.partSleepRecords,
		PartitionRepeat: c.partRepeat, PartitionHandlers: c.partHandlers,
		ShareRecords: c.shareRecords, ShareSessions: c.shareSessions, SharePoll: c.sharePoll, ShareProcesses: c.shareProcs,
		ShareQueueSleep: c.shareQSleep.String(), ShareQueueConcurrency: c.shareQConc, ShareQueueConfigs: sessionsPollText(c.shareQConfigs),
		ShareQueueRecords: c.shareQRecords, ShareStrictLoop: c.shareStrictLoop}
}

func printReport(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\n%d CPUs (%s), %s; load %s → %s; %.0fs in all\n\n", rep.Machine.CPUs, rep.Machine.CPUModel,
		rep.Machine.GoVersion, rep.Machine.LoadBefore, rep.Machine.LoadAfter, rep.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Results) > 0 {
		fmt.Fprintln(tw, "workload\tconsumer\trecords\ts\trecords/s\tvs baseline\tof theory\tp50 ms\tp99 ms\tRSS MiB\tCPU s\tPG round trips/record")
	}
	for _, r := range rep.Results {
		ratio, theory, p50, p99 := "", "", "", ""
		if r.Baseline != "" {
			ratio = fmt.Sprintf("%.2f× %s", r.Ratio, r.Baseline)
		}
		if r.Theoretical > 0 {
			theory = fmt.Sprintf("%.0f%% of %.0f/s", 100*r.OfTheory, r.Theoretical)
		}
		if r.LatencyRecords > 0 {
			p50, p99 = fmt.Sprintf("%.2f", r.P50), fmt.Sprintf("%.2f", r.P99)
		}
		consumer := r.Consumer
		if r.PerTransaction > 0 {
			consumer += fmt.Sprintf(" [%.1f/tx]", r.PerTransaction)
		}
		rt := ""
		if r.RoundTrips > 0 {
			rt = fmt.Sprintf("%.3f", r.RoundTrips)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%s\n", r.Workload, consumer, r.Records, r.Seconds,
			r.PerSecond, ratio, theory, p50, p99, r.PeakRSSMiB, r.CPUSeconds, rt)
	}
	tw.Flush()
	for _, s := range rep.Servers {
		if s.FsyncTest != "" {
			fmt.Fprintf(w, "\npg_test_fsync on the %s server's disk (%s):\n%s", s.Name, s.DataDir, s.FsyncTest)
		}
	}
	if rep.Scaling != nil {
		printScaling(w, rep.Scaling)
	}
	if rep.Share != nil {
		printShare(w, rep.Share)
	}
	for _, cv := range rep.Curves {
		fmt.Fprintf(w, "\ncurve %s (%s); theory %s, ceiling %.0f/s\n", cv.Name, cv.Fixed, cv.Theory, cv.Ceiling)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, cv.X+"\trecords\ts\trecords/s\ttheory/s\tof theory\t")
		for _, p := range cv.Points {
			fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.0f\t%.0f\t%.0f%%\t\n", p.X, p.Records, p.Seconds, p.PerSecond, p.Theoretical, 100*p.OfTheory)
		}
		tw.Flush()
	}
}

// machine describes this machine from /proc, best effort.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryMiB = kb / 1024
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += " " + strings.TrimSpace(string(b))
	}
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// startProfile starts a CPU profile into path, and an execution trace into
// $TIDEMARK_BENCH_TRACE when set; the returned func stops both. An empty
// path starts nothing.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	stops := []func(){func() { pprof.StopCPUProfile(); f.Close() }}
	if tp := os.Getenv("TIDEMARK_BENCH_TRACE"); tp != "" {
		tf, err := os.Create(tp)
		if err != nil {
			stops[0]()
			return nil, err
		}
		if err := trace.Start(tf); err != nil {
			tf.Close()
			stops[0]()
			return nil, err
		}
		stops = append(stops, func() { trace.Stop(); tf.Close() })
	}
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}, nil
}
