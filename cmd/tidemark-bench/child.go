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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// The consumers a child can be.
const (
	franzLoop    = "franz-loop"     // plain franz-go poll loop that does nothing
	franzPool    = "franz-pool"     // franz-go poll loop feeding a goroutine pool over channels
	shareLoop    = "franz-share"    // plain franz-go share-group poll loop that does nothing
	readerLoop   = "kafkago-reader" // plain kafka-go consumer-group Reader loop
	sequentialC  = "sequential"     // franz-go, one record at a time in the poll loop
	tidemarkC    = "tidemark"       // the runner over Adapter
	insertLoop   = "pg-insert"      // single-row INSERT per transaction, no Kafka
	childFlag    = "-child"
	readyLine    = "ready"
	goLine       = "go"
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

	// Share sets the share source's sessions and records per poll
	// (adapter share; 0: the source's defaults).
	ShareSessions int `json:"share_sessions,omitempty"`
	SharePoll     int `json:"share_poll,omitempty"`
	// ShareStrict makes the plain share loop fetch as the share source's
	// sessions do: at most SharePoll records per fetch
	// (kgo.ShareMaxRecordsStrict), a fetch only while a poll runs.
	ShareStrict bool `json:"share_strict,omitempty"`
	// Gated holds every handler until the harness writes goLine on the
	// child's stdin, and starts the window then; the child prints
	// readyLine when its first record arrives. The processes of one
	// share-workload run thus start their windows together, whichever
	// joined first.
	Gated bool `json:"gated,omitempty"`
	// TrackOffsets, when not 0, tracks the offsets handled (partitions
	// 0 to Partitions-1, offsets below TrackOffsets) and reports them.
	TrackOffsets int64 `json:"track_offsets,omitempty"`
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

	// FirstNS and EndNS are the window's ends, Unix nanoseconds: the
	// share workload sums the windows of several processes.
	FirstNS int64 `json:"first_ns,omitempty"`
	EndNS   int64 `json:"end_ns,omitempty"`
	// Seen and Again are the offsets whose handler finished, over the
	// child's whole run (window or not), and those that finished at
	// least twice here (TrackOffsets); Outside counts the handler calls
	// beyond the tracked offsets. Redelivered counts the handler calls of
	// records whose delivery count was above 1.
	Seen        []partitionRanges `json:"seen,omitempty"`
	Again       []partitionRanges `json:"again,omitempty"`
	Outside     int64             `json:"outside,omitempty"`
	Redelivered int64             `json:"redelivered,omitempty"`
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
	return runGatedChild(ctx, spec, ready, nil)
}

// runGatedChild is runChild for a Gated spec too: once start is closed it
// writes goLine to the child's stdin.
func runGatedChild(ctx context.Context, spec childSpec, ready chan<- struct{}, start <-chan struct{}) (childResult, usage, error) {
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
	var in io.WriteCloser
	if start != nil {
		if in, err = cmd.StdinPipe(); err != nil {
			return childResult{}, usage{}, err
		}
	}
	if err := cmd.Start(); err != nil {
		return childResult{}, usage{}, err
	}
	if in != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			defer in.Close()
			select {
			case <-start:
				_, _ = io.WriteString(in, goLine+"\n")
			case <-stop:
			}
		}()
	}
	var res childResult
	var got bool
	sc := bufio.NewScanner(out)
	// The result line carries the offsets handled as ranges: far longer
	// than the scanner's default 64 KiB when a share group interleaves
	// its members' records.
	sc.Buffer(make([]byte, 64<<10), 256<<20)
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
	var serr error
	if serr = sc.Err(); serr != nil {
		_, _ = io.Copy(io.Discard, out) // let the child finish writing
	}
	werr := cmd.Wait()
	if werr == nil && serr != nil {
		werr = fmt.Errorf("reading its output: %w", serr)
	}
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
	if spec.Gated {
		go m.awaitGo(os.Stdin)
	}
	switch spec.Consumer {
	case franzLoop:
		err = runFranzLoop(ctx, spec, m)
	case franzPool:
		err = runFranzPool(ctx, spec, m)
	case shareLoop:
		err = runShareLoop(ctx, spec, m)
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

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
