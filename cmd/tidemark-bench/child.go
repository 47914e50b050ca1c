package main

// Every consumer runs in a child process of the harness: the harness starts
// its own binary again with the hidden first argument -child and a JSON
// childSpec. One process per consumer is what makes peak RSS and CPU
// seconds mean something: VmHWM and getrusage(RUSAGE_SELF) of one process
// would mix every run before it (the high water mark of RSS never comes
// down), and a consumer's garbage or goroutines would weigh on the next.
//
// CPU seconds are user+sys from the rusage wait4 returns for the child.
// Peak RSS is the child's own VmHWM (/proc/self/status), read by the child
// as it ends, not the rusage's ru_maxrss: Linux carries the high water mark
// of the pre-exec address space into ru_maxrss at exec, and Go starts a
// child vfork-style, sharing the harness's memory until the exec, so
// ru_maxrss is max(the harness's RSS, the child's) — every consumer then
// showed the harness's ~120 MiB, the pgx INSERT loop included.
//
// In a live run the child prints "ready" on stdout once it has handled a
// warm-up record from every partition: it is then assigned everything and
// both clients know every partition's leader, so the harness's paced
// producer can start without its first records waiting on a metadata
// refresh (right after a topic is created that wait reached a second). At the
// end it prints "result " followed by a JSON childResult. It logs only errors, on
// stderr, which the harness keeps and shows if the child fails.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// The consumers a child can be.
const (
	franzLoop    = "franz-loop"     // plain franz-go poll loop that does nothing
	franzPool    = "franz-pool"     // franz-go poll loop feeding a goroutine pool over channels
	readerLoop   = "kafkago-reader" // plain kafka-go consumer-group Reader loop
	sequentialC  = "sequential"     // franz-go, one record at a time in the poll loop
	tidemarkC    = "tidemark"       // the runner over Adapter
	insertLoop   = "pg-insert"      // single-row INSERT per transaction, no Kafka
	childFlag    = "-child"
	stampMagic   = "TMTS"
	stampLen     = len(stampMagic) + 8
	readyLine    = "ready"
	resultPrefix = "result "
)

// childSpec tells a child what to consume and how.
type childSpec struct {
	Consumer string   `json:"consumer"`
	Adapter  string   `json:"adapter,omitempty"`
	Brokers  []string `json:"brokers,omitempty"`
	Topic    string   `json:"topic,omitempty"`
	Group    string   `json:"group,omitempty"`
	// Records ends the run after that many records (0: no limit); For
	// ends it that long after the first record (0: no limit). In a live
	// run only stamped records count and are timed.
	Records int           `json:"records,omitempty"`
	For     time.Duration `json:"for,omitempty"`
	Live    bool          `json:"live,omitempty"`
	// Partitions is the topic's partition count, for the live warm-up.
	Partitions int           `json:"partitions,omitempty"`
	Timeout    time.Duration `json:"timeout"`

	Handler     string        `json:"handler"` // noop, sleep, cpu, inbox
	Sleep       time.Duration `json:"sleep,omitempty"`
	HashRounds  int           `json:"hash_rounds,omitempty"`
	Concurrency int           `json:"concurrency,omitempty"`
	Order       string        `json:"order,omitempty"`
	High        int           `json:"high,omitempty"`
	PartBytes   int           `json:"part_bytes,omitempty"`

	DSN       string        `json:"dsn,omitempty"`
	Schema    string        `json:"schema,omitempty"`
	Batch     int           `json:"batch,omitempty"`
	BatchWait time.Duration `json:"batch_wait,omitempty"`
	Queued    bool          `json:"queued,omitempty"` // inbox.QueuedHandler, not Handler
	Size      int           `json:"size,omitempty"`

	// Fetch sets the plain franz-go loop's fetch options (nil: franz-go's
	// defaults); the partitions workload gives it those of tidemark's
	// franz adapter (adapterFetch).
	Fetch *fetchSettings `json:"fetch,omitempty"`
	// Files is the open files the child needs (kafkago: a connection per
	// partition); it raises its soft RLIMIT_NOFILE to that or fails.
	Files int `json:"files,omitempty"`

	// CPUProfile is a file for a CPU profile of the child's whole life.
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// childResult is what a child reports.
type childResult struct {
	Records   int           `json:"records"`
	Seconds   float64       `json:"seconds"`
	WindowCPU float64       `json:"window_cpu"`
	P50       time.Duration `json:"p50,omitempty"`
	P99       time.Duration `json:"p99,omitempty"`
	Samples   int           `json:"samples,omitempty"`
	// PerTransaction is the inbox's records per transaction (Batch).
	PerTransaction float64 `json:"per_tx,omitempty"`
	// RoundTrips is what the child's PostgreSQL pool sent over its whole
	// run (inbox and INSERT consumers): queries, pipelines, prepares.
	RoundTrips int64 `json:"round_trips,omitempty"`
	// PeakRSSKiB is VmHWM of the child's own address space.
	PeakRSSKiB int `json:"peak_rss_kib"`
	// Fetch is the fetch settings of the franz-go client the consumer
	// ran with, read back from it before it started (tidemark over franz,
	// and the plain loop when given its settings); FetchEnd the same after
	// it stopped (the franz adapter lowers its sizes when records are
	// smaller than runner.RecordShape states).
	Fetch    *fetchSettings `json:"fetch,omitempty"`
	FetchEnd *fetchSettings `json:"fetch_end,omitempty"`
}

// usage is what the kernel says the child used over its whole life.
type usage struct {
	PeakRSSMiB float64
	CPUSeconds float64
}

// runChild runs spec in a child process and waits for it. When ready is not
// nil it is closed once the child reports its first record. Cancelling ctx
// kills the child.
func runChild(ctx context.Context, spec childSpec, ready chan<- struct{}) (childResult, usage, error) {
	exe, err := os.Executable()
	if err != nil {
		return childResult{}, usage{}, err
	}
	arg, err := json.Marshal(spec)
	if err != nil {
		return childResult{}, usage{}, err
	}
	cmd := exec.CommandContext(ctx, exe, childFlag, string(arg))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return childResult{}, usage{}, err
	}
	if err := cmd.Start(); err != nil {
		return childResult{}, usage{}, err
	}
	var res childResult
	var got bool
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == readyLine && ready != nil:
			close(ready)
			ready = nil
		case strings.HasPrefix(line, resultPrefix):
			if err := json.Unmarshal([]byte(line[len(resultPrefix):]), &res); err == nil {
				got = true
			}
		}
	}
	werr := cmd.Wait()
	if werr == nil && !got {
		werr = errors.New("exited without a result")
	}
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = "…" + msg[len(msg)-2000:]
		}
		return childResult{}, usage{}, fmt.Errorf("%s: %v: %s", spec.describe(), werr, msg)
	}
	var u usage
	u.PeakRSSMiB = float64(res.PeakRSSKiB) / 1024
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		u.CPUSeconds = tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
	}
	return res, u, nil
}

func (s childSpec) describe() string {
	d := s.Consumer
	if s.Consumer == tidemarkC {
		d += " over " + s.Adapter
	}
	if s.Handler != "" {
		d += " (" + s.Handler + ")"
	}
	return d
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration((tvSeconds(ru.Utime) + tvSeconds(ru.Stime)) * float64(time.Second))
}

// raiseFileLimit raises the soft RLIMIT_NOFILE to n when it is lower, and
// fails with what to do when the hard limit is below n.
func raiseFileLimit(n int) error {
	if n <= 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur >= uint64(n) {
		return nil
	}
	if lim.Max < uint64(n) {
		return fmt.Errorf("%d open files needed (one connection per partition and a margin), but the hard limit is %d: raise it (ulimit -Hn %d, as root) or use fewer partitions", n, lim.Max, n)
	}
	lim.Cur = uint64(n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", n, err)
	}
	return nil
}

// peakRSS returns this process's VmHWM in KiB, or 0 when /proc has none.
func peakRSS() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int
			fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib)
			return kib
		}
	}
	return 0
}

// childMain is the child's whole life; it returns the exit code.
func childMain(arg string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(arg), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "tidemark-bench child: bad spec:", err)
		return 2
	}
	if err := raiseFileLimit(spec.Files); err != nil {
		fmt.Fprintf(os.Stderr, "tidemark-bench child %s: %v\n", spec.describe(), err)
		return 1
	}
	// The profile covers the child's whole life, as its CPU seconds do.
	stopProfile, err := startProfile(spec.CPUProfile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tidemark-bench child %s: %v\n", spec.describe(), err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	m := newMeter(spec)
	switch spec.Consumer {
	case franzLoop:
		err = runFranzLoop(ctx, spec, m)
	case franzPool:
		err = runFranzPool(ctx, spec, m)
	case readerLoop:
		err = runReaderLoop(ctx, spec, m)
	case sequentialC:
		err = runSequential(ctx, spec, m)
	case tidemarkC:
		err = runTidemark(ctx, spec, m)
	case insertLoop:
		err = runInsertLoop(ctx, spec, m)
	default:
		err = fmt.Errorf("unknown consumer %q", spec.Consumer)
	}
	stopProfile()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tidemark-bench child %s: %v\n", spec.describe(), err)
		return 1
	}
	res := m.result()
	res.PeakRSSKiB = peakRSS()
	b, _ := json.Marshal(res)
	fmt.Printf("%s%s\n", resultPrefix, b)
	return 0
}

// meter times a child's window, counts its records and keeps its latency
// samples. Its methods are safe for concurrent use.
type meter struct {
	limit  int64
	runFor time.Duration
	live   bool
	parts  int

	warmMu sync.Mutex
	warm   map[int32]bool

	count    atomic.Int64
	started  atomic.Bool
	startMu  sync.Mutex
	first    time.Time
	firstCPU time.Duration

	stopOnce sync.Once
	done     chan struct{}
	records  int64
	end      time.Time
	endCPU   time.Duration

	latMu sync.Mutex
	lat   []time.Duration

	perTx float64     // set by the inbox consumer as it ends
	rt    *roundTrips // the PostgreSQL consumers' round trips, or nil

	fetch, fetchEnd *fetchSettings // the franz-go client's, when it has one
}

func newMeter(s childSpec) *meter {
	return &meter{limit: int64(s.Records), runFor: s.For, live: s.Live, parts: s.Partitions,
		warm: map[int32]bool{}, done: make(chan struct{})}
}

// begin is called when a record's handling starts, with its partition and
// value, and reports whether the record counts. In a drain run every
// record counts and the first starts the window. In a live run only
// stamped records count, the first of them starts the window, and their
// latency is sampled; the others are warm-up records.
func (m *meter) begin(partition int32, value []byte) bool {
	if !m.live {
		// The throughput phase reads the clock only for the first
		// record, as the plain loops do: a clock read per record would
		// be charged to tidemark's no-op handler alone.
		if !m.started.Load() {
			m.startWindow(time.Now())
		}
		return true
	}
	now := time.Now()
	ts, ok := unstamp(value)
	if !ok {
		m.warmUp(partition)
		return false
	}
	m.startWindow(now)
	m.latMu.Lock()
	m.lat = append(m.lat, now.Sub(ts))
	m.latMu.Unlock()
	return true
}

func (m *meter) startWindow(now time.Time) {
	if m.started.Load() {
		return
	}
	m.startMu.Lock()
	defer m.startMu.Unlock()
	if m.started.Load() {
		return
	}
	m.first, m.firstCPU = now, processCPU()
	m.started.Store(true)
	if m.runFor > 0 {
		time.AfterFunc(m.runFor, m.stop)
	}
}

// warmUp notes a warm-up record from partition and says ready once every
// partition has sent one.
func (m *meter) warmUp(partition int32) {
	m.warmMu.Lock()
	defer m.warmMu.Unlock()
	if len(m.warm) == m.parts {
		return
	}
	m.warm[partition] = true
	if len(m.warm) == m.parts {
		fmt.Println(readyLine)
	}
}

// add counts n finished records and stops the window at the limit.
func (m *meter) add(n int) {
	if c := m.count.Add(int64(n)); m.limit > 0 && c >= m.limit {
		m.stop()
	}
}

func (m *meter) stop() {
	m.stopOnce.Do(func() {
		m.end, m.endCPU = time.Now(), processCPU()
		m.records = m.count.Load()
		close(m.done)
	})
}

func (m *meter) stopped() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

func (m *meter) result() childResult {
	r := childResult{Records: int(m.records), Seconds: m.end.Sub(m.first).Seconds(), WindowCPU: (m.endCPU - m.firstCPU).Seconds(),
		PerTransaction: m.perTx, Fetch: m.fetch, FetchEnd: m.fetchEnd}
	if m.rt != nil {
		r.RoundTrips = m.rt.n.Load()
	}
	m.latMu.Lock()
	defer m.latMu.Unlock()
	if len(m.lat) > 0 {
		r.P50, r.P99 = latencies(m.lat)
		r.Samples = len(m.lat)
	}
	return r
}

// stamp writes the produce time into the head of value, which must be at
// least stampLen bytes; unstamp reads it back. The record's own Kafka
// timestamp would do, but it has millisecond resolution.
func stamp(value []byte, t time.Time) {
	copy(value, stampMagic)
	binary.BigEndian.PutUint64(value[len(stampMagic):], uint64(t.UnixNano()))
}

func unstamp(value []byte) (time.Time, bool) {
	if len(value) < stampLen || string(value[:len(stampMagic)]) != stampMagic {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(value[len(stampMagic):]))), true
}

var hashSink atomic.Uint32

// hashWork is the CPU-bound handler's work: rounds chained SHA-256 sums.
func hashWork(rounds int) {
	var sum [32]byte
	for range rounds {
		sum = sha256.Sum256(sum[:])
	}
	hashSink.Add(uint32(sum[0])) // keeps the compiler from dropping the loop
}

// work returns the handler body of spec: what every consumer does per
// record, so that the plain ones and tidemark do the same.
func work(spec childSpec) func(ctx context.Context) {
	switch spec.Handler {
	case "sleep":
		return func(ctx context.Context) {
			t := time.NewTimer(spec.Sleep)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	case "cpu":
		return func(context.Context) { hashWork(spec.HashRounds) }
	default:
		return nil
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// runFranzLoop is the fetch ceiling: a franz-go group consumer that polls
// and does nothing with the records; it commits nothing. It reads
// uncommitted and fetches with franz-go's defaults, unless spec.Fetch
// gives it other fetch settings, which it checks it got.
func runFranzLoop(ctx context.Context, spec childSpec, m *meter) error {
	opts := []kgo.Opt{kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit()}
	if spec.Fetch != nil {
		opts = append(opts, spec.Fetch.opts()...)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if spec.Fetch != nil {
		got := clientFetch(cl)
		if got != *spec.Fetch {
			return fmt.Errorf("the client's fetch settings are %v, not the %v asked for", got, *spec.Fetch)
		}
		m.fetch = &got
	}
	for !m.stopped() {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return err
		}
		n := fs.NumRecords()
		if n == 0 {
			continue
		}
		if !m.live {
			m.startWindow(time.Now())
			m.add(n)
			continue
		}
		fs.EachRecord(func(r *kgo.Record) {
			if m.begin(r.Partition, r.Value) {
				m.add(1)
			}
		})
	}
	return nil
}

// runFranzPool is the least a parallel consumer does: a franz-go poll loop
// sends each record over a channel to Concurrency goroutines, which run the
// handler body and send the record back over a second channel to one
// goroutine that takes the completions, as anything tracking what it may
// commit must. No ordering, no offset tracking, no commits, no flow
// control: it is the floor under tidemark's dispatch, not a usable
// consumer. It counts records in the handler goroutines as tidemark's
// handler does.
func runFranzPool(ctx context.Context, spec childSpec, m *meter) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	conc := max(spec.Concurrency, 1)
	recs, done := make(chan *kgo.Record, conc), make(chan *kgo.Record, conc)
	body := work(spec)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range recs {
				counts := m.begin(r.Partition, r.Value)
				if body != nil {
					body(ctx)
				}
				if counts {
					m.add(1)
				}
				done <- r
			}
		}()
	}
	completed := make(chan struct{})
	go func() {
		defer close(completed)
		for range done {
		}
	}()
	defer func() {
		close(recs)
		wg.Wait()
		close(done)
		<-completed
	}()
	// The last record is counted by a pool goroutine while the loop may be
	// waiting for more: end the poll then.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-pctx.Done():
		}
	}()
	for !m.stopped() {
		fs := cl.PollFetches(pctx)
		if m.stopped() {
			return nil
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		for it := fs.RecordIter(); !it.Done(); {
			select {
			case recs <- it.Next():
			case <-m.done:
				return nil
			}
		}
	}
	return nil
}

// runReaderLoop is what a kafka-go user writes: a consumer-group Reader,
// FetchMessage and CommitMessages per message, commits sent asynchronously
// once a second (CommitInterval, as tidemark's CommitInterval default), and
// the fetch settings of tidemark's kafkago adapter.
func runReaderLoop(ctx context.Context, spec childSpec, m *meter) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        spec.Brokers,
		GroupID:        spec.Group,
		Topic:          spec.Topic,
		MinBytes:       1,
		MaxBytes:       1 << 20,
		MaxWait:        500 * time.Millisecond,
		StartOffset:    kafka.FirstOffset,
		CommitInterval: time.Second,
	})
	defer r.Close()
	for !m.stopped() {
		msg, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if m.begin(int32(msg.Partition), msg.Value) {
			m.add(1)
		}
		if err := r.CommitMessages(ctx, msg); err != nil {
			return err
		}
	}
	return nil
}

// runSequential is what many services do today: one record at a time,
// handled in the poll loop, offsets committed after each poll.
func runSequential(ctx context.Context, spec childSpec, m *meter) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group),
		kgo.ConsumeTopics(spec.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	h := work(spec)
	for !m.stopped() {
		fs := cl.PollRecords(ctx, 500)
		if err := fs.Err0(); err != nil {
			return err
		}
		for it := fs.RecordIter(); !it.Done() && !m.stopped(); {
			rec := it.Next()
			counts := m.begin(rec.Partition, rec.Value)
			if h != nil {
				h(ctx)
			}
			if counts {
				m.add(1)
			}
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return err
		}
	}
	return nil
}

// newSource returns the adapter spec.Adapter over spec's topic and group,
// as tidemark's child runs it.
func newSource(spec childSpec, log *slog.Logger) (runner.Source, error) {
	switch spec.Adapter {
	case "franz":
		fopts := []franz.Option{franz.Logger(log)}
		if spec.PartBytes > 0 {
			fopts = append(fopts, franz.ClientOptions(kgo.FetchMaxPartitionBytes(int32(spec.PartBytes))))
		}
		return franz.New(spec.Brokers, spec.Group, []string{spec.Topic}, fopts...)
	case "kafkago":
		return kafkago.New(spec.Brokers, spec.Group, []string{spec.Topic}, kafkago.Logger(log))
	}
	return nil, fmt.Errorf("unknown adapter %q", spec.Adapter)
}

// runnerOptions returns the runner's options of spec, the handler aside.
func runnerOptions(spec childSpec, log *slog.Logger) ([]runner.Option, error) {
	order, err := parseOrder(spec.Order)
	if err != nil {
		return nil, err
	}
	opts := []runner.Option{runner.Concurrency(max(spec.Concurrency, 1)), runner.Order(order), runner.Logger(log)}
	if spec.High > 0 {
		opts = append(opts, runner.WaterMarks(spec.High, spec.High/2))
	}
	return opts, nil
}

// fetchSettings are a franz-go client's fetch options, as OptValue reads
// them back.
type fetchSettings struct {
	MaxBytes          int32         `json:"fetch_max_bytes"`
	MaxPartitionBytes int32         `json:"fetch_max_partition_bytes"`
	ConcurrentFetches int           `json:"max_concurrent_fetches"`
	MaxWait           time.Duration `json:"fetch_max_wait"`
	MinBytes          int32         `json:"fetch_min_bytes"`
	ReadCommitted     bool          `json:"read_committed"`
}

// clientFetch reads cl's fetch settings. It must not run while cl fetches:
// franz-go stores the sizes atomically (UpdateFetchMaxBytes) but OptValue
// reads them plainly.
func clientFetch(cl *kgo.Client) fetchSettings {
	var f fetchSettings
	f.MaxBytes, _ = cl.OptValue(kgo.FetchMaxBytes).(int32)
	f.MaxPartitionBytes, _ = cl.OptValue(kgo.FetchMaxPartitionBytes).(int32)
	f.ConcurrentFetches, _ = cl.OptValue(kgo.MaxConcurrentFetches).(int)
	f.MaxWait, _ = cl.OptValue(kgo.FetchMaxWait).(time.Duration)
	f.MinBytes, _ = cl.OptValue(kgo.FetchMinBytes).(int32)
	level, _ := cl.OptValue(kgo.FetchIsolationLevel).(int8)
	f.ReadCommitted = level == 1 // kmsg: 0 read uncommitted, 1 read committed
	return f
}

// opts returns the client options that set f.
func (f fetchSettings) opts() []kgo.Opt {
	iso := kgo.ReadUncommitted()
	if f.ReadCommitted {
		iso = kgo.ReadCommitted()
	}
	return []kgo.Opt{kgo.FetchMaxBytes(f.MaxBytes), kgo.FetchMaxPartitionBytes(f.MaxPartitionBytes),
		kgo.MaxConcurrentFetches(f.ConcurrentFetches), kgo.FetchMaxWait(f.MaxWait), kgo.FetchMinBytes(f.MinBytes),
		kgo.FetchIsolationLevel(iso)}
}

func (f fetchSettings) String() string {
	return fmt.Sprintf("FetchMaxBytes %d, FetchMaxPartitionBytes %d, MaxConcurrentFetches %d, FetchMaxWait %v, FetchMinBytes %d, read committed %v",
		f.MaxBytes, f.MaxPartitionBytes, f.ConcurrentFetches, f.MaxWait, f.MinBytes, f.ReadCommitted)
}

// adapterFetch returns the fetch settings tidemark's franz adapter runs
// with under spec: it builds the adapter and the runner as runTidemark does
// (runner.New makes the adapter derive its fetch sizes from the memory
// bound, runner.FetchLimiter) and reads them back from the adapter's
// client, then closes it. Nothing is sent to a broker. log is the
// adapter's and the runner's logger.
func adapterFetch(spec childSpec, log *slog.Logger) (fetchSettings, error) {
	if spec.Adapter != "franz" {
		return fetchSettings{}, fmt.Errorf("fetch settings of adapter %q: only franz has franz-go's", spec.Adapter)
	}
	src, err := newSource(spec, log)
	if err != nil {
		return fetchSettings{}, err
	}
	defer src.Close()
	opts, err := runnerOptions(spec, log)
	if err != nil {
		return fetchSettings{}, err
	}
	noop := func(context.Context, runner.Record) error { return nil }
	if _, err := runner.New(src, append(opts, runner.Handle(spec.Topic, noop))...); err != nil {
		return fetchSettings{}, err
	}
	return clientFetch(src.(*franz.Source).Client()), nil
}

// runTidemark runs the runner over spec.Adapter until the meter stops, then
// shuts it down gracefully.
func runTidemark(ctx context.Context, spec childSpec, m *meter) error {
	quiet := quietLogger()
	src, err := newSource(spec, quiet)
	if err != nil {
		return err
	}
	opts, err := runnerOptions(spec, quiet)
	if err != nil {
		return err
	}
	var h runner.Handler
	if spec.Handler == "inbox" {
		m.rt = &roundTrips{}
		pool, err := openTracedPool(ctx, spec.DSN, spec.Schema, m.rt)
		if err != nil {
			return err
		}
		defer pool.Close()
		iopts := []inbox.Option{inbox.Logger(quiet)}
		if spec.Batch > 1 {
			iopts = append(iopts, inbox.Batch(spec.Batch))
			if spec.BatchWait > 0 {
				iopts = append(iopts, inbox.BatchWait(spec.BatchWait))
			}
		}
		store, err := inbox.New(pool, spec.Group, iopts...)
		if err != nil {
			return err
		}
		defer func() {
			if st := store.Stats(); st.Batches > 0 {
				m.perTx = float64(st.Applied) / float64(st.Batches)
			}
		}()
		apply := store.Handler(insertEffect)
		if spec.Queued {
			apply = store.QueuedHandler(insertQueued)
		}
		h = func(ctx context.Context, rec runner.Record) error {
			counts := m.begin(rec.Partition, rec.Value)
			if err := apply(ctx, rec); err != nil {
				return err
			}
			if counts {
				m.add(1)
			}
			return nil
		}
		opts = append(opts, runner.OnAssign(store.AssignHook()))
	} else {
		body := work(spec)
		h = func(ctx context.Context, rec runner.Record) error {
			counts := m.begin(rec.Partition, rec.Value)
			if body != nil {
				body(ctx)
			}
			if counts {
				m.add(1)
			}
			return nil
		}
	}
	r, err := runner.New(src, append(opts, runner.Handle(spec.Topic, h))...)
	if err != nil {
		return err
	}
	if fs, ok := src.(*franz.Source); ok {
		// Before Run and after it the client is not fetching: its
		// settings can be read (see clientFetch).
		f := clientFetch(fs.Client())
		m.fetch = &f
		defer func() {
			f := clientFetch(fs.Client())
			m.fetchEnd = &f
		}()
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-m.done:
	case err := <-done:
		return fmt.Errorf("runner stopped early: %v", err)
	case <-ctx.Done():
		err = fmt.Errorf("handled %d records, wanted %d, in %v: %w", m.count.Load(), m.limit, spec.Timeout, ctx.Err())
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if serr := r.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// The effect of the inbox workload and the row of the INSERT ceiling: the
// same statement, the same row.
const (
	effectsDDL = `CREATE TABLE effects (
	id        bigserial PRIMARY KEY,
	topic     text   NOT NULL,
	partition int    NOT NULL,
	"offset"  bigint NOT NULL,
	key       bytea,
	value     bytea
)`
	effectSQL = `INSERT INTO effects (topic, partition, "offset", key, value) VALUES ($1, $2, $3, $4, $5)`
)

func insertEffect(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
	_, err := tx.Exec(ctx, effectSQL, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value)
	return err
}

// poolConns is the pool size of the inbox consumers and of the INSERT
// ceiling alike.
const poolConns = 8

// openPool opens a pool of poolConns connections whose unqualified names
// resolve in schema.
func openPool(ctx context.Context, dsn, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// Not pgx's message: it may quote the string, password included.
		return nil, errors.New("TIDEMARK_PG_DSN is not a valid connection string")
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL does not answer: %w (scripts/testbed up && source .testbed/env)", err)
	}
	return pool, nil
}

// runInsertLoop is the inbox's ceiling: spec.Records single-row INSERTs,
// each its own transaction (autocommit), from poolConns connections at
// once, the row shaped like the inbox workload's effect.
func runInsertLoop(ctx context.Context, spec childSpec, m *meter) error {
	m.rt = &roundTrips{}
	pool, err := openTracedPool(ctx, spec.DSN, spec.Schema, m.rt)
	if err != nil {
		return err
	}
	defer pool.Close()
	value := make([]byte, spec.Size)
	var next atomic.Int64
	errs := make(chan error, poolConns)
	var wg sync.WaitGroup
	for w := range poolConns {
		wg.Go(func() {
			key := []byte(fmt.Sprintf("key-%d", w))
			for i := next.Add(1); i <= int64(spec.Records); i = next.Add(1) {
				m.begin(0, nil)
				if _, err := pool.Exec(ctx, effectSQL, "ceiling", int32(i%12), i, key, value); err != nil {
					errs <- err
					return
				}
				m.add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
