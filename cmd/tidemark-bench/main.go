// Command tidemark-bench measures tidemark against baselines on a real
// Kafka broker, in one run on one topic, and prints a table and a JSON file.
// Every tidemark figure is given as a ratio against a baseline measured in
// the same run, because the machines it runs on are shared and noisy.
//
// Workloads:
//
//	noop   N records of S bytes over P partitions: a plain franz-go poll loop
//	       that does nothing (the fetch ceiling) against tidemark with a
//	       no-op handler.
//	sleep  a handler sleeping L per record, K keys, concurrency C: tidemark
//	       against a sequential one-record-at-a-time consumer, and against
//	       the theoretical min(C/L, no-op throughput).
//	adapters  tidemark over the kafka-go adapter against tidemark over the
//	       franz adapter on the same topic (-records records), with a no-op
//	       handler (concurrency 64) and with the sleep handler (concurrency C).
//
// Usage:
//
//	tidemark-bench -brokers 127.0.0.1:19092 -workload all -json docs/bench/runner.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

type result struct {
	Workload    string  `json:"workload"`
	Consumer    string  `json:"consumer"`
	Records     int     `json:"records"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"records_per_second"`
	Baseline    string  `json:"baseline,omitempty"`
	Ratio       float64 `json:"ratio,omitempty"`
	Theoretical float64 `json:"theoretical_per_second,omitempty"`
	OfTheory    float64 `json:"ratio_of_theoretical,omitempty"`
}

type config struct {
	brokers     string
	workload    string
	records     int
	partitions  int
	size        int
	keys        int
	concurrency int
	sleep       time.Duration
	sleepFor    time.Duration
	seqFor      time.Duration
	jsonOut     string
	cpuProfile  string
	noopConc    int
	high        int
	partBytes   int
}

func main() {
	var c config
	flag.StringVar(&c.brokers, "brokers", os.Getenv("TIDEMARK_KAFKA_BROKERS"), "Kafka seed brokers (default $TIDEMARK_KAFKA_BROKERS)")
	flag.StringVar(&c.workload, "workload", "all", "noop, sleep or all")
	flag.IntVar(&c.records, "records", 1_000_000, "records for the noop workload")
	flag.IntVar(&c.partitions, "partitions", 12, "partitions of the topic")
	flag.IntVar(&c.size, "size", 100, "record value size in bytes")
	flag.IntVar(&c.keys, "keys", 10_000, "distinct keys")
	flag.IntVar(&c.concurrency, "concurrency", 256, "tidemark's concurrency for the sleep workload")
	flag.DurationVar(&c.sleep, "sleep", 5*time.Millisecond, "handler latency of the sleep workload")
	flag.DurationVar(&c.sleepFor, "sleep-records-seconds", 10*time.Second, "how long the tidemark sleep run should take at the theoretical rate (sets its record count)")
	flag.DurationVar(&c.seqFor, "sequential-for", 5*time.Second, "how long the sequential baseline runs")
	flag.StringVar(&c.jsonOut, "json", "", "write the results as JSON to this file")
	flag.IntVar(&c.noopConc, "noop-concurrency", 64, "tidemark's concurrency for the noop workload")
	flag.IntVar(&c.high, "high", 10000, "tidemark's per-partition high water mark in records (low is half)")
	flag.IntVar(&c.partBytes, "fetch-partition-bytes", 0, "franz-go FetchMaxPartitionBytes for tidemark's client (0: franz-go's default, 1 MiB)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the tidemark runs to this file")
	flag.Parse()
	if c.brokers == "" {
		fail(errors.New("no brokers: pass -brokers or set TIDEMARK_KAFKA_BROKERS (scripts/testbed up && source .testbed/env)"))
	}
	if c.workload != "noop" && c.workload != "sleep" && c.workload != "all" && c.workload != "adapters" {
		fail(fmt.Errorf("-workload %q: want noop, sleep, adapters or all", c.workload))
	}
	profile = c.cpuProfile
	var results []result
	var ceiling float64
	if c.workload == "noop" || c.workload == "all" {
		rs, err := noop(c)
		if err != nil {
			fail(err)
		}
		results = append(results, rs...)
		ceiling = rs[1].PerSecond
	}
	if c.workload == "sleep" || c.workload == "all" {
		rs, err := sleepy(c, ceiling)
		if err != nil {
			fail(err)
		}
		results = append(results, rs...)
	}
	if c.workload == "adapters" {
		rs, err := adapters(c)
		if err != nil {
			fail(err)
		}
		results = append(results, rs...)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "workload\tconsumer\trecords\tseconds\trecords/s\tvs baseline\tof theory")
	for _, r := range results {
		ratio, theory := "", ""
		if r.Baseline != "" {
			ratio = fmt.Sprintf("%.2fx %s", r.Ratio, r.Baseline)
		}
		if r.Theoretical > 0 {
			theory = fmt.Sprintf("%.0f%% of %.0f/s", 100*r.OfTheory, r.Theoretical)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t%s\t%s\n", r.Workload, r.Consumer, r.Records, r.Seconds, r.PerSecond, ratio, theory)
	}
	tw.Flush()
	if c.jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"at": time.Now().UTC().Format(time.RFC3339), "config": map[string]any{
			"records": c.records, "partitions": c.partitions, "size": c.size, "keys": c.keys,
			"concurrency": c.concurrency, "sleep": c.sleep.String()}, "results": results}, "", "  ")
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tidemark-bench:", err)
	os.Exit(1)
}

func brokers(c config) []string { return []string{c.brokers} }

// setup creates a fresh topic and produces n records with keys over c.keys.
func setup(c config, name string, n int) (string, error) {
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers(c)...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	topic := fmt.Sprintf("bench-%s-%d", name, time.Now().UnixNano())
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, int32(c.partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Values are random, so compression does not make a fetch hold many
	// times more records than real data would.
	rnd := rand.New(rand.NewPCG(1, 2))
	var perr atomic.Value
	for i := range n {
		value := make([]byte, c.size)
		for j := range value {
			value[j] = byte(rnd.Uint32())
		}
		r := &kgo.Record{Topic: topic, Key: []byte("key-" + strconv.Itoa(i%c.keys)), Value: value}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				perr.Store(err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return "", err
	}
	if e, _ := perr.Load().(error); e != nil {
		return "", fmt.Errorf("produce: %w", e)
	}
	return topic, nil
}

// plainLoop is the fetch ceiling: a franz-go group consumer that polls and
// does nothing with the records, for n records. Like the tidemark run, it is
// timed from creating the client (so both include joining the group) to the
// last record.
func plainLoop(c config, topic string, n int) (time.Duration, error) {
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers(c)...), kgo.ConsumerGroup(fmt.Sprintf("plain-%d", time.Now().UnixNano())),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return 0, err
		}
		got += fs.NumRecords()
	}
	return time.Since(start), nil
}

// sequential is what many services do today: one record at a time, handled
// in the poll loop, for d.
func sequential(c config, topic string, d time.Duration, h func()) (int, time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers(c)...), kgo.ConsumerGroup(fmt.Sprintf("seq-%d", time.Now().UnixNano())),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	got := 0
	var start time.Time
	for start.IsZero() || time.Since(start) < d {
		fs := cl.PollRecords(ctx, 100)
		if err := fs.Err0(); err != nil {
			return 0, 0, err
		}
		if start.IsZero() {
			start = time.Now()
		}
		for range fs.NumRecords() {
			h()
			got++
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return 0, 0, err
		}
	}
	return got, time.Since(start), nil
}

var profile string

// tidemark runs the runner over the franz adapter until n records were
// handled, and returns the time from the first handled record.
func tidemark(c config, topic string, n int, conc int, h func()) (time.Duration, error) {
	return tidemarkOn(c, "franz", topic, n, conc, h)
}

// tidemarkOn is tidemark over the named adapter (franz or kafkago).
func tidemarkOn(c config, adapter, topic string, n int, conc int, h func()) (time.Duration, error) {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	group := fmt.Sprintf("tidemark-%s-%d", adapter, time.Now().UnixNano())
	var src runner.Source
	var err error
	switch adapter {
	case "franz":
		fopts := []franz.Option{franz.Logger(quiet)}
		if c.partBytes > 0 {
			fopts = append(fopts, franz.ClientOptions(kgo.FetchMaxPartitionBytes(int32(c.partBytes))))
		}
		src, err = franz.New(brokers(c), group, []string{topic}, fopts...)
	case "kafkago":
		src, err = kafkago.New(brokers(c), group, []string{topic}, kafkago.Logger(quiet))
	default:
		err = fmt.Errorf("unknown adapter %q", adapter)
	}
	if err != nil {
		return 0, err
	}
	var handled atomic.Int64
	all := make(chan struct{})
	r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		h()
		if handled.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}), runner.Concurrency(conc), runner.Logger(quiet), runner.WaterMarks(c.high, c.high/2))
	if err != nil {
		return 0, err
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, err
		}
		defer pprof.StopCPUProfile()
		if os.Getenv("TIDEMARK_BENCH_TRACE") != "" {
			tf, err := os.Create(os.Getenv("TIDEMARK_BENCH_TRACE"))
			if err != nil {
				return 0, err
			}
			defer tf.Close()
			if err := trace.Start(tf); err != nil {
				return 0, err
			}
			defer trace.Stop()
		}
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-all:
	case err := <-done:
		return 0, fmt.Errorf("runner stopped early: %v", err)
	case <-time.After(10 * time.Minute):
		return 0, errors.New("tidemark run did not finish in 10 minutes")
	}
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		return 0, err
	}
	return took, <-done
}

func noop(c config) ([]result, error) {
	topic, err := setup(c, "noop", c.records)
	if err != nil {
		return nil, err
	}
	plain, err := plainLoop(c, topic, c.records)
	if err != nil {
		return nil, fmt.Errorf("plain loop: %w", err)
	}
	tm, err := tidemark(c, topic, c.records, c.noopConc, func() {})
	if err != nil {
		return nil, fmt.Errorf("tidemark: %w", err)
	}
	p := result{Workload: "noop", Consumer: "plain franz-go loop", Records: c.records, Seconds: plain.Seconds(), PerSecond: float64(c.records) / plain.Seconds()}
	t := result{Workload: "noop", Consumer: fmt.Sprintf("tidemark (key order, %d)", c.noopConc), Records: c.records, Seconds: tm.Seconds(), PerSecond: float64(c.records) / tm.Seconds(), Baseline: "plain franz-go loop"}
	t.Ratio = t.PerSecond / p.PerSecond
	return []result{p, t}, nil
}

func sleepy(c config, ceiling float64) ([]result, error) {
	theory := float64(c.concurrency) / c.sleep.Seconds()
	if ceiling > 0 {
		theory = min(theory, ceiling)
	}
	n := int(theory * c.sleepFor.Seconds())
	topic, err := setup(c, "sleep", n)
	if err != nil {
		return nil, err
	}
	h := func() { time.Sleep(c.sleep) }
	seqN, seqD, err := sequential(c, topic, c.seqFor, h)
	if err != nil {
		return nil, fmt.Errorf("sequential: %w", err)
	}
	tm, err := tidemark(c, topic, n, c.concurrency, h)
	if err != nil {
		return nil, fmt.Errorf("tidemark: %w", err)
	}
	s := result{Workload: "sleep " + c.sleep.String(), Consumer: "sequential", Records: seqN, Seconds: seqD.Seconds(), PerSecond: float64(seqN) / seqD.Seconds()}
	t := result{Workload: "sleep " + c.sleep.String(), Consumer: fmt.Sprintf("tidemark (key order, %d)", c.concurrency), Records: n, Seconds: tm.Seconds(),
		PerSecond: float64(n) / tm.Seconds(), Baseline: "sequential", Theoretical: theory}
	t.Ratio = t.PerSecond / s.PerSecond
	t.OfTheory = t.PerSecond / theory
	return []result{s, t}, nil
}

// adapters runs tidemark over both adapters on one topic, no-op and sleepy.
func adapters(c config) ([]result, error) {
	topic, err := setup(c, "adapters", c.records)
	if err != nil {
		return nil, err
	}
	var out []result
	for _, w := range []struct {
		name string
		conc int
		h    func()
	}{
		{"noop", 64, func() {}},
		{"sleep " + c.sleep.String(), c.concurrency, func() { time.Sleep(c.sleep) }},
	} {
		var franzRate float64
		for _, adapter := range []string{"franz", "kafkago"} {
			took, err := tidemarkOn(c, adapter, topic, c.records, w.conc, w.h)
			if err != nil {
				return nil, fmt.Errorf("%s over %s: %w", w.name, adapter, err)
			}
			r := result{Workload: w.name, Consumer: fmt.Sprintf("tidemark over %s (key order, %d)", adapter, w.conc),
				Records: c.records, Seconds: took.Seconds(), PerSecond: float64(c.records) / took.Seconds()}
			if adapter == "franz" {
				franzRate = r.PerSecond
			} else {
				r.Baseline, r.Ratio = "tidemark over franz", r.PerSecond/franzRate
			}
			out = append(out, r)
		}
	}
	return out, nil
}
