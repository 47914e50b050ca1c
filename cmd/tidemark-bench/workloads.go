package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// bench runs the workloads of one invocation and collects their results.
type bench struct {
	c   config
	adm *kadm.Client
	cl  *kgo.Client // the backlog producer and admin client

	// ceiling is tidemark's no-op throughput per adapter, measured by the
	// noop workload of this run: the cap of every theoretical line.
	ceiling map[string]float64
	// random is the pool backlog values are cut from: incompressible, so
	// a fetch holds no more records than real data would.
	random []byte
	seq    atomic.Int64
}

func newBench(c config) (*bench, error) {
	// Every workload produces to a new topic; with franz-go's default
	// MetadataMinAge (5 s) the first records for it could wait that long
	// for the client to look the topic up.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	b := &bench{c: c, cl: cl, adm: kadm.NewClient(cl), ceiling: map[string]float64{}}
	b.random = make([]byte, 8<<20)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range b.random {
		b.random[i] = byte(rnd.Uint32())
	}
	return b, nil
}

func (b *bench) close() { b.cl.Close() }

// name returns a fresh topic or group name.
func (b *bench) name(kind string) string {
	return fmt.Sprintf("bench-%s-%d-%d", kind, time.Now().UnixNano(), b.seq.Add(1))
}

// topic creates a fresh topic with the run's partition count.
func (b *bench) topic(ctx context.Context, kind string) (string, error) {
	return b.topicOf(ctx, kind, b.c.partitions)
}

// topicOf creates a fresh topic with partitions partitions.
func (b *bench) topicOf(ctx context.Context, kind string, partitions int) (string, error) {
	t := b.name(kind)
	resp, err := b.adm.CreateTopic(ctx, int32(partitions), 1, nil, t)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", t, err)
	}
	// CreateTopics answers before every partition has a leader; records
	// produced before then wait on metadata refreshes (up to seconds).
	for {
		md, err := b.adm.Metadata(ctx, t)
		if err == nil && leadersKnown(md, t, partitions) {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func leadersKnown(md kadm.Metadata, topic string, partitions int) bool {
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil || len(td.Partitions) != partitions {
		return false
	}
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// drop deletes topics once a workload is done with them, so that a run
// leaves the broker's disk as it found it. Failing to is not worth failing
// the run for.
func (b *bench) drop(topics ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = b.adm.DeleteTopics(ctx, topics...)
}

// produce writes n records of the run's size to a fresh topic, keyed
// round-robin over keys, and returns the topic.
func (b *bench) produce(ctx context.Context, kind string, n, keys int) (string, error) {
	topic, err := b.topic(ctx, kind)
	if err != nil {
		return "", err
	}
	return topic, b.produceTo(ctx, topic, 0, n, keys)
}

// produceTo writes n records of the run's size to topic, keyed round-robin
// over keys (record i has key i mod keys). When partitions, the topic's
// partition count, is not 0 the records are sent grouped by the partition
// their key hashes to, in the same order within each partition, so the
// topic holds the same records as with 0: spread round-robin over 1,200
// partitions, the producer's batches held a few records each, and the
// broker took 45 s for 200,000 records.
func (b *bench) produceTo(ctx context.Context, topic string, partitions, n, keys int) error {
	start := time.Now()
	var perr atomic.Value
	size := b.c.size
	record := func(i int) *kgo.Record {
		off := (i * 7919 * size) % (len(b.random) - size)
		return &kgo.Record{Topic: topic, Key: []byte("key-" + strconv.Itoa(i%keys)), Value: b.random[off : off+size : off+size]}
	}
	produce := func(r *kgo.Record) {
		b.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				perr.Store(err)
			}
		})
	}
	if partitions > 0 {
		// The client's default partitioner hashes keys as this one does
		// (murmur2, KafkaHasher); were they to differ, only the grouping
		// would be lost, not the content.
		part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
		keyPart := make([]int, min(keys, n))
		for k := range keyPart {
			keyPart[k] = part.Partition(record(k), partitions)
		}
		byPart := make([][]int32, partitions)
		for i := range n {
			p := keyPart[i%keys]
			byPart[p] = append(byPart[p], int32(i))
		}
		for _, is := range byPart {
			for _, i := range is {
				produce(record(int(i)))
			}
		}
	} else {
		for i := range n {
			produce(record(i))
		}
	}
	if err := b.cl.Flush(ctx); err != nil {
		return err
	}
	if e, _ := perr.Load().(error); e != nil {
		return fmt.Errorf("produce to %s: %w", topic, e)
	}
	b.logf("produced %d records over %d keys to %s in %v", n, keys, topic, time.Since(start).Round(time.Millisecond))
	return nil
}

func (b *bench) logf(format string, args ...any) {
	if b.c.verbose {
		fmt.Printf("  · "+format+"\n", args...)
	}
}

// spec returns the child spec of consumer on topic with the run's
// settings; the caller sets the stop condition and the handler.
func (b *bench) spec(consumer, adapter, topic, handler string, conc int) childSpec {
	return childSpec{
		Consumer: consumer, Adapter: adapter, Brokers: b.c.brokers, Topic: topic, Group: b.name("group"),
		Timeout: 3 * time.Minute, Handler: handler, Sleep: b.c.sleep, HashRounds: b.c.hashRounds,
		Concurrency: conc, Order: b.c.order, High: b.c.high, PartBytes: b.c.partBytes,
		DSN: b.c.dsn, Size: b.c.size,
	}
}

// label names a consumer in the table.
func (b *bench) label(s childSpec) string {
	switch s.Consumer {
	case franzLoop:
		return "plain franz-go poll loop"
	case franzPool:
		return fmt.Sprintf("franz-go loop + goroutine pool (C=%d)", s.Concurrency)
	case readerLoop:
		return "plain kafka-go Reader loop"
	case sequentialC:
		return "sequential, one record at a time"
	case insertLoop:
		return fmt.Sprintf("single-row INSERT per tx, %d conns", poolConns)
	}
	l := fmt.Sprintf("tidemark over %s (%s, C=%d)", s.Adapter, s.Order, s.Concurrency)
	if s.Handler == "inbox" {
		l = inboxMode(s)
	}
	return l
}

// measure runs spec to its stop condition, repeat times, and returns its
// row (the median rate when repeated); unless spec has no Kafka, it then
// measures the consumer's latency in a paced phase.
func (b *bench) measure(ctx context.Context, workload string, spec childSpec) (Result, error) {
	r := Result{Workload: workload, Consumer: b.label(spec), Order: spec.Order}
	if spec.Consumer == tidemarkC {
		r.Adapter, r.Concurrency = spec.Adapter, spec.Concurrency
	} else {
		r.Order = ""
	}
	res, u, err := runChild(ctx, spec, nil)
	if err != nil {
		return r, err
	}
	r.Records, r.Seconds, r.PerSecond = res.Records, res.Seconds, float64(res.Records)/res.Seconds
	r.PeakRSSMiB, r.CPUSeconds, r.WindowCPUSeconds = u.PeakRSSMiB, u.CPUSeconds, res.WindowCPU
	r.PerTransaction = res.PerTransaction
	if res.RoundTrips > 0 && res.Records > 0 {
		r.RoundTrips = float64(res.RoundTrips) / float64(res.Records)
	}
	b.logf("%-55s %9d records in %6.2fs  %10.0f/s  (%.1f CPU s)", r.Consumer, r.Records, r.Seconds, r.PerSecond, r.CPUSeconds)
	return r, nil
}

// latency measures spec's end-to-end latency at min(-latency-load × its own
// measured rate, -latency-max-rate) for -latency-for, on a fresh topic, while the
// consumer is running and assigned: every consumer is measured at the same
// share of what it can do, and none is measured behind a backlog.
func (b *bench) latency(ctx context.Context, spec childSpec, r *Result) error {
	if b.c.latencyFor <= 0 || spec.Consumer == insertLoop {
		return nil
	}
	rate := min(r.PerSecond*b.c.latencyLoad, b.c.latencyMax)
	n := max(int(rate*b.c.latencyFor.Seconds()), 20)
	topic, err := b.topic(ctx, "live")
	if err != nil {
		return err
	}
	defer b.drop(topic)
	spec.Topic, spec.Group, spec.Live, spec.Records, spec.For = topic, b.name("group"), true, n, 0
	spec.Partitions = b.c.partitions
	spec.CPUProfile = ""
	ready := make(chan struct{})
	var res childResult
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		var err error
		res, _, err = runChild(gctx, spec, ready)
		return err
	})
	g.Go(func() error { return b.paced(gctx, topic, ready, rate, n) })
	if err := g.Wait(); err != nil {
		return fmt.Errorf("latency of %s: %w", r.Consumer, err)
	}
	r.P50, r.P99 = ms(res.P50), ms(res.P99)
	r.LatencyRate, r.LatencyRecords = rate, res.Samples
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// paced produces unstamped warm-up records to topic, every 20 ms and
// round-robin over the partitions, until the consumer says it has handled
// one from each, and then n records stamped with their produce time, at rate
// records per second, each sent on its own (no linger).
func (b *bench) paced(ctx context.Context, topic string, ready <-chan struct{}, rate float64, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.c.brokers...), kgo.ProducerLinger(0), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
			// Warm-up records go round-robin (their Partition is set);
			// the others by their key's hash, as the default does.
			keyed := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
			return func(r *kgo.Record, n int) int {
				if r.Key == nil {
					return int(r.Partition) % n
				}
				return keyed.Partition(r, n)
			}
		})))
	if err != nil {
		return err
	}
	defer cl.Close()
	var perr atomic.Value
	send := func(i int, stamped bool) {
		r := &kgo.Record{Value: make([]byte, b.c.size)}
		if stamped {
			r.Key = []byte("key-" + strconv.Itoa(i%b.c.keys))
			stamp(r.Value, time.Now())
		} else {
			r.Partition = int32(i)
		}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil && ctx.Err() == nil {
				perr.Store(err)
			}
		})
	}
	warm := time.NewTicker(20 * time.Millisecond)
	defer warm.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil // the consumer's error, if any, is the one to report
		case <-ready:
		case <-warm.C:
			send(i, false)
			continue
		}
		break
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for sent := 0; sent < n; {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for due := min(n, int(rate*time.Since(start).Seconds())+1); sent < due; sent++ {
			send(sent, true)
		}
	}
	if err := cl.Flush(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	if e, _ := perr.Load().(error); e != nil {
		return fmt.Errorf("paced produce: %w", e)
	}
	return nil
}

// repeated runs every spec -repeat times, taking them in turn (so a slow
// spell of the shared machine falls on all of them rather than on one), and
// returns one row per spec: the run at the median rate, with the median as
// its rate and every run's rate in Runs. Then it measures each one's
// latency once.
func (b *bench) repeated(ctx context.Context, workload string, specs []childSpec) ([]Result, error) {
	runs := make([][]Result, len(specs))
	for range b.c.repeat {
		for i, s := range specs {
			s.Group = b.name("group")
			r, err := b.measure(ctx, workload, s)
			if err != nil {
				return nil, err
			}
			runs[i] = append(runs[i], r)
			specs[i].CPUProfile = "" // the first run only
		}
	}
	rows := make([]Result, len(specs))
	for i := range rows {
		rows[i] = medianRun(runs[i])
		if err := b.latency(ctx, specs[i], &rows[i]); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// noop: the fetch ceilings (plain franz-go loop, plain kafka-go Reader loop)
// against tidemark over each adapter with a no-op handler, all draining the
// same -records records.
func (b *bench) noop(ctx context.Context) ([]Result, error) {
	topic, err := b.produce(ctx, "noop", b.c.records, b.c.keys)
	if err != nil {
		return nil, err
	}
	defer b.drop(topic)
	// Each adapter's baseline, then tidemark over it; over franz also the
	// goroutine-pool floor, compared with the same baseline.
	var specs []childSpec
	var base, tm []int // per row: the index of its baseline (-1: none); tidemark rows
	for _, a := range b.c.adapters {
		bc := franzLoop
		if a == "kafkago" {
			bc = readerLoop
		}
		bi := len(specs)
		specs = append(specs, b.spec(bc, "", topic, "noop", 0), b.spec(tidemarkC, a, topic, "noop", b.c.noopConc))
		base = append(base, -1, bi)
		tm = append(tm, bi+1)
		if a == "franz" {
			specs = append(specs, b.spec(franzPool, "", topic, "noop", b.c.noopConc))
			base = append(base, bi)
		}
	}
	for i := range specs {
		specs[i].Records = b.c.records
	}
	if b.c.cpuProfile != "" {
		specs[1].CPUProfile = b.c.cpuProfile
	}
	rows, err := b.repeated(ctx, "noop", specs)
	if err != nil {
		return nil, err
	}
	for i, bi := range base {
		if bi >= 0 {
			rows[i].against(rows[bi])
		}
	}
	for _, i := range tm {
		b.ceiling[specs[i].Adapter] = rows[i].PerSecond
	}
	return rows, nil
}

// sleep: an I/O-bound handler (sleep L) — the sequential consumer against
// tidemark at -concurrency over each adapter, each for -run-for on one
// topic, and tidemark against min(C/L, its no-op rate).
func (b *bench) sleepy(ctx context.Context) ([]Result, error) {
	theory := parallelTheory(b.c.concurrency, b.c.sleep, b.maxCeiling())
	return b.handlerWorkload(ctx, "sleep "+b.c.sleep.String(), "sleep", b.c.concurrency, func(adapter string) float64 {
		return parallelTheory(b.c.concurrency, b.c.sleep, b.ceiling[adapter])
	}, theory)
}

// cpu: a CPU-bound handler (-cpu-work of hashing per record) — the
// sequential consumer against tidemark at -noop-concurrency. No consumer
// can beat min(cores / work, no-op rate), and the broker shares the cores.
func (b *bench) cpu(ctx context.Context) ([]Result, error) {
	per := b.c.hashTook
	cores := runtime.NumCPU()
	theory := func(adapter string) float64 {
		t := float64(cores) / per.Seconds()
		if c := b.ceiling[adapter]; c > 0 {
			t = min(t, c)
		}
		return t
	}
	return b.handlerWorkload(ctx, fmt.Sprintf("cpu %v/record", per.Round(time.Microsecond)), "cpu", b.c.noopConc, theory,
		float64(cores)/per.Seconds())
}

func (b *bench) maxCeiling() float64 {
	m := 0.0
	for _, c := range b.ceiling {
		m = max(m, c)
	}
	return m
}

// handlerWorkload runs the sequential consumer and tidemark over each
// adapter with handler, all for -run-for on one topic holding enough
// records for the fastest at its theoretical rate.
func (b *bench) handlerWorkload(ctx context.Context, workload, handler string, conc int, theory func(string) float64, most float64) ([]Result, error) {
	n := int(most*b.c.runFor.Seconds()*1.1) + 1000
	topic, err := b.produce(ctx, handler, n, b.c.keys)
	if err != nil {
		return nil, err
	}
	defer b.drop(topic)
	specs := []childSpec{b.spec(sequentialC, "", topic, handler, 0)}
	for _, a := range b.c.adapters {
		specs = append(specs, b.spec(tidemarkC, a, topic, handler, conc))
	}
	for i := range specs {
		specs[i].For, specs[i].Records = b.c.runFor, n
	}
	rows, err := b.repeated(ctx, workload, specs)
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(rows); i++ {
		rows[i].against(rows[0])
		rows[i].ofTheory(theory(specs[i].Adapter))
	}
	return rows, nil
}

// inbox: exactly-once effects through pkg/inbox — one record per
// transaction and batched, with both effect shapes (Effect, QueuedEffect)
// — against the single-row INSERT ceiling: the same row inserted
// -inbox-records times, one per transaction, from as many connections as
// the inbox's pool has, in the same run on the same server. It runs on the
// bed's server (-dsn) and, with -durable, again on a server the bench
// starts with fsync and synchronous_commit on and its data on disk, where
// commits cost what they cost. Every row reports its round trips per
// record.
func (b *bench) inbox(ctx context.Context) ([]Result, []Server, error) {
	bed := Server{Name: "bed"}
	var err error
	if bed.Settings, err = serverSettings(ctx, b.c.dsn); err != nil {
		return nil, nil, err
	}
	servers := []Server{bed}
	dsns := []string{b.c.dsn}
	if b.c.inboxDurable {
		b.logf("starting the durable PostgreSQL under %s and running pg_test_fsync", b.c.durableDir)
		d, srv, err := startDurablePG(ctx, b.c.durableDir)
		if err != nil {
			return nil, nil, fmt.Errorf("the durable server: %w", err)
		}
		defer d.stop()
		servers = append(servers, *srv)
		dsns = append(dsns, d.dsn)
	}
	n := b.c.inboxRecords
	var rows []Result
	for i, srv := range servers {
		topic, err := b.produce(ctx, "inbox", n, b.c.keys)
		if err != nil {
			return nil, nil, err
		}
		r, err := b.inboxOn(ctx, dsns[i], describeServer(srv), topic)
		b.drop(topic)
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, r...)
	}
	return rows, servers, nil
}

// inboxOn runs the inbox consumers and the ceiling on one server.
func (b *bench) inboxOn(ctx context.Context, dsn, server, topic string) ([]Result, error) {
	schema, cleanup, err := b.inboxSchema(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	n := b.c.inboxRecords
	s := b.spec(insertLoop, "", "", "", 0)
	s.Records, s.Schema, s.DSN = n, schema, dsn
	specs := []childSpec{s}
	for _, queued := range []bool{false, true} {
		for _, batch := range []int{1, b.c.inboxBatch} {
			s := b.spec(tidemarkC, b.c.adapters[0], topic, "inbox", b.c.concurrency)
			s.Records, s.Schema, s.Batch, s.Queued, s.DSN = n, schema, batch, queued, dsn
			if batch > 1 {
				s.BatchWait = b.c.inboxWait
			}
			specs = append(specs, s)
		}
	}
	rows, err := b.repeated(ctx, "inbox on "+server, specs)
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(rows); i++ {
		rows[i].against(rows[0])
	}
	return rows, nil
}

// inboxSchema creates a throwaway schema with the inbox migrated and the
// effects table on dsn's server, and returns a func that drops it.
func (b *bench) inboxSchema(ctx context.Context, dsn string) (string, func(), error) {
	schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		// Not the DSN: it may hold a password.
		return "", nil, fmt.Errorf("PostgreSQL does not answer: %w (scripts/testbed up && source .testbed/env)", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, err
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, dsn); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			conn.Close(ctx)
		}
	}
	pool, err := openPool(ctx, dsn, schema)
	if err != nil {
		cleanup()
		return "", nil, err
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool, inbox.Logger(quietLogger())); err != nil {
		cleanup()
		return "", nil, err
	}
	if _, err := pool.Exec(ctx, effectsDDL); err != nil {
		cleanup()
		return "", nil, err
	}
	return schema, cleanup, nil
}

// concurrencyCurve: tidemark's throughput with the sleep handler at each
// -curve-concurrency, key order, -keys keys, each point for -run-for on one
// shared topic, against min(C/L, no-op rate).
func (b *bench) concurrencyCurve(ctx context.Context) (Curve, error) {
	adapter := b.c.adapters[0]
	ceil := b.ceiling[adapter]
	cv := Curve{Name: "concurrency", X: "concurrency C",
		Fixed:  fmt.Sprintf("sleep L=%v, %s order, %d keys, %d partitions, tidemark over %s", b.c.sleep, b.c.order, b.c.keys, b.c.partitions, adapter),
		Theory: "min(C/L, no-op ceiling)", Ceiling: ceil, SleepSeconds: b.c.sleep.Seconds()}
	if ceil > 0 {
		cv.CeilingFrom = fmt.Sprintf("tidemark over %s, no-op, this run", adapter)
	}
	most := 0
	for _, c := range b.c.curveConc {
		most = max(most, b.points(parallelTheory(c, b.c.sleep, ceil)))
	}
	topic, err := b.produce(ctx, "curve-c", most, b.c.keys)
	if err != nil {
		return cv, err
	}
	defer b.drop(topic)
	for _, c := range b.c.curveConc {
		theory := parallelTheory(c, b.c.sleep, ceil)
		p, err := b.point(ctx, topic, c, c, theory)
		if err != nil {
			return cv, err
		}
		cv.Points = append(cv.Points, p)
	}
	return cv, nil
}

// keysCurve: the same against the number of keys in key order, at
// -concurrency, a topic per point, against min(min(K,C)/L, no-op rate).
func (b *bench) keysCurve(ctx context.Context) (Curve, error) {
	adapter := b.c.adapters[0]
	ceil := b.ceiling[adapter]
	cv := Curve{Name: "keys", X: "keys K",
		Fixed:  fmt.Sprintf("sleep L=%v, key order, C=%d, %d partitions, tidemark over %s", b.c.sleep, b.c.concurrency, b.c.partitions, adapter),
		Theory: "min(min(K,C)/L, no-op ceiling)", Ceiling: ceil, SleepSeconds: b.c.sleep.Seconds(), Concurrency: b.c.concurrency}
	if ceil > 0 {
		cv.CeilingFrom = fmt.Sprintf("tidemark over %s, no-op, this run", adapter)
	}
	saved := b.c.order
	b.c.order = "key"
	defer func() { b.c.order = saved }()
	for _, k := range b.c.curveKeys {
		theory := keyTheory(k, b.c.concurrency, b.c.sleep, ceil)
		topic, err := b.produce(ctx, "curve-k", b.points(theory), k)
		if err != nil {
			return cv, err
		}
		p, err := b.point(ctx, topic, k, b.c.concurrency, theory)
		b.drop(topic)
		if err != nil {
			return cv, err
		}
		cv.Points = append(cv.Points, p)
	}
	return cv, nil
}

// points is how many records a curve point needs: -run-for at its
// theoretical rate, and a little more, so it ends on time, not on records.
func (b *bench) points(theory float64) int {
	return int(theory*b.c.runFor.Seconds()*1.1) + 100
}

func (b *bench) point(ctx context.Context, topic string, x, conc int, theory float64) (Point, error) {
	s := b.spec(tidemarkC, b.c.adapters[0], topic, "sleep", conc)
	s.For, s.Records = b.c.runFor, b.points(theory)
	r, err := b.measure(ctx, "curve", s)
	if err != nil {
		return Point{}, err
	}
	return Point{X: x, Records: r.Records, Seconds: r.Seconds, PerSecond: r.PerSecond, Theoretical: theory,
		OfTheory: r.PerSecond / theory, PeakRSSMiB: r.PeakRSSMiB, CPUSeconds: r.CPUSeconds}, nil
}

// calibrate finds how many hash rounds take about target, and how long
// that many take (the median of repeated timings).
func calibrate(target time.Duration) (int, time.Duration) {
	const probe = 2000
	best := time.Duration(1 << 62)
	for range 5 {
		t := time.Now()
		hashWork(probe)
		best = min(best, time.Since(t))
	}
	rounds := max(int(float64(probe)*float64(target)/float64(best)), 1)
	var took []float64
	for range 51 {
		t := time.Now()
		hashWork(rounds)
		took = append(took, float64(time.Since(t)))
	}
	slices.Sort(took)
	return rounds, time.Duration(took[len(took)/2])
}
