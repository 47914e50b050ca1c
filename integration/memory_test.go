//go:build integration

package integration_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// memShape is the record shape of the memory tests: 8-byte keys and 24-byte
// values, of which 3 bytes random and 21 zero, so that a batch compresses
// (snappy) by a ratio close to, and below, 4. With about 10 bytes of framing a
// record is 42 bytes uncompressed: the tests state 40 (RecordShape).
const (
	memKeyBytes, memValueBytes = 8, 24
	memMinRecordBytes          = 40
	memMaxCompression          = 4
	memShapeBatchBytes         = 16 << 10 // the producer's largest batch: below the derived fetch sizes
)

// produceShaped writes n records of memShape to topic, round-robin over its
// partitions, in batches of at most memShapeBatchBytes, snappy-compressed, and
// returns their uncompressed size (keys, values, and 10 bytes of framing
// each).
func produceShaped(t *testing.T, topic string, n int) int64 {
	t.Helper()
	cl := bed.Client(t, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(memShapeBatchBytes),
		kgo.ProducerBatchCompression(kgo.SnappyCompression()), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var first error
	for i := range n {
		v := make([]byte, memValueBytes)
		rand.Read(v[:3])
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k%07d", i%10_000_000)), Value: v}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("produce %d records: %v", n, err)
	}
	if first != nil {
		t.Fatalf("produce %d records: %v", n, first)
	}
	return int64(n) * (memKeyBytes + memValueBytes + 10)
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// checkShape fails the test unless topic's records are within the stated
// shape: compressed on disk by at most memMaxCompression (the log's size
// against the records' uncompressed size; batch headers make it a slight
// underestimate).
func checkShape(t *testing.T, topic string, uncompressed int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dirs, err := bed.Admin(t).DescribeAllLogDirs(ctx, nil)
	if err != nil {
		t.Fatalf("describe log dirs of %s: %v", topic, err)
	}
	var onDisk int64
	dirs.Each(func(d kadm.DescribedLogDir) {
		d.Topics.Each(func(p kadm.DescribedLogDirPartition) {
			if p.Topic == topic {
				onDisk += p.Size
			}
		})
	})
	ratio := float64(uncompressed) / float64(onDisk)
	t.Logf("records of %s: %d bytes uncompressed, %d on disk: compression %.2f (stated at most %d)", topic, uncompressed, onDisk, ratio, memMaxCompression)
	if onDisk == 0 || ratio > memMaxCompression {
		t.Fatalf("the records are compressed %.2f times, outside the stated shape (at most %d): the test would not test the bound", ratio, memMaxCompression)
	}
}

// memSampler measures the live heap as the last collection found it
// (runtime/metrics /gc/heap/live:bytes: what was reachable, not what the
// fetch goroutines allocated between the collection and the reading, which
// runtime.MemStats' HeapAlloc also counts), and the process's resident set
// (residentBytes), both above a baseline taken when it is created.
type memSampler struct {
	t                 *testing.T
	baseHeap, maxHeap uint64
	baseRSS, maxRSS   uint64
	live              []metrics.Sample
}

func newMemSampler(t *testing.T) *memSampler {
	m := &memSampler{t: t, live: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	runtime.GC()
	debug.FreeOSMemory()
	m.baseHeap, m.baseRSS = m.liveHeap(), uint64(residentBytes(t))
	return m
}

func (m *memSampler) liveHeap() uint64 {
	metrics.Read(m.live)
	if m.live[0].Value.Kind() != metrics.KindUint64 {
		m.t.Fatal("runtime/metrics has no /gc/heap/live:bytes")
	}
	return m.live[0].Value.Uint64()
}

// sample reads the resident set, then collects and reads the live heap.
func (m *memSampler) sample() {
	m.sampleRSS()
	runtime.GC()
	if h := m.liveHeap(); h > m.baseHeap {
		m.maxHeap = max(m.maxHeap, h-m.baseHeap)
	}
}

// sampleRSS reads the resident set only.
func (m *memSampler) sampleRSS() {
	if rss := uint64(residentBytes(m.t)); rss > m.baseRSS {
		m.maxRSS = max(m.maxRSS, rss-m.baseRSS)
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// shapeWatch fails a test when the franz adapter reports records outside
// the stated shape (it lowers its fetches and logs it once, at warn). It
// sees every record whatever the level of the handler it wraps, which gets
// only those it is enabled for: a watch behind an error-level handler
// would never see the warning.
type shapeWatch struct {
	slog.Handler
	outside atomic.Bool
}

func (w *shapeWatch) Enabled(context.Context, slog.Level) bool { return true }

func (w *shapeWatch) Handle(ctx context.Context, r slog.Record) error {
	return watchShape(ctx, w.Handler, &w.outside, r)
}

// watchShape notes a report of records outside the stated shape in outside
// and passes r on to h if h is enabled for its level.
func watchShape(ctx context.Context, h slog.Handler, outside *atomic.Bool, r slog.Record) error {
	if strings.Contains(r.Message, "than runner.RecordShape states") {
		outside.Store(true)
	}
	if !h.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handle(ctx, r)
}

func (w *shapeWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &shapeWatchAttrs{Handler: w.Handler.WithAttrs(as), w: w}
}

type shapeWatchAttrs struct {
	slog.Handler
	w *shapeWatch
}

func (a *shapeWatchAttrs) Enabled(context.Context, slog.Level) bool { return true }

func (a *shapeWatchAttrs) Handle(ctx context.Context, r slog.Record) error {
	return watchShape(ctx, a.Handler, &a.w.outside, r)
}

func (a *shapeWatchAttrs) WithAttrs(as []slog.Attr) slog.Handler {
	return &shapeWatchAttrs{Handler: a.Handler.WithAttrs(as), w: a.w}
}

// flapSink plays a runner that takes records slowly and pauses partitions
// as they fill: it drops what it is handed (so that the heap holds only
// what the source keeps), pauses a third of the partitions it got records
// for, and resumes each 30 ms later, so that the source parks records and
// its client keeps its fetches buffered.
type flapSink struct {
	src     *franz.Source
	handled atomic.Int64
	mu      sync.Mutex
	n       int
	resume  chan runner.TP
}

func (s *flapSink) Assigned(context.Context, []runner.Assignment) error { return nil }
func (s *flapSink) Revoked(context.Context, []runner.TP, time.Time) error {
	return nil
}
func (s *flapSink) Lost(context.Context, []runner.TP) error { return nil }
func (s *flapSink) Fetched(_ context.Context, bs []runner.Batch) (int, error) {
	for _, b := range bs {
		s.handled.Add(int64(len(b.Records)))
		s.mu.Lock()
		s.n++
		pause := s.n%3 == 0
		s.mu.Unlock()
		if pause && len(b.Records) > 0 {
			s.src.Pause([]runner.TP{b.TP})
			select {
			case s.resume <- b.TP:
			default:
				s.src.Resume([]runner.TP{b.TP})
			}
		}
	}
	time.Sleep(2 * time.Millisecond) // a slow runner
	return 2000, nil
}

// TestFranzSourceMemory: what the franz adapter holds for records — its
// client's fetch buffers, decoded, the poll it is handing over, and the
// records it parks for paused partitions — stays within the share of
// MaxBufferedBytes it is given (FetchLimits.Bytes), under the stated record
// shape, on the real broker, with a runner that takes records slowly and
// pauses and resumes partitions all the time. The live heap is measured
// after a collection; the resident set (VmRSS) also counts garbage not
// collected yet.
//
// The bound: held <= 2k * F * E + parked <= share (docs/adapters.md), with
// k = 1 here (one broker), so one fetch takes at most F * E = 7/8 * share /
// 2 in memory. Live heap growth <= share + F * E + 1 MiB. The 1 MiB is the
// client's and the adapter's fixed state (metadata, cursors and the fetch
// session of 12 partitions, connections, maps), measured once everything is
// consumed (logged: about 0.1 MiB). F * E is the measurement's: the
// collection that measures the live heap runs concurrently with the
// client's fetch goroutine, and what it decodes during the collection's
// mark phase counts as live in that cycle; with both CPUs busy a mark phase
// outlasts a fetch (measured: up to 10.0 MiB live over an 8 MiB share,
// otherwise at most 7.6). The resident set also counts what the collector
// has not reclaimed yet: with GOGC=100 the heap grows to twice the live
// heap before a collection, so RSS growth <= 2 * (share + 1 MiB) + 8 MiB
// of runtime (goroutine stacks, GC metadata, pages not yet returned to the
// kernel); measured at most 19 MiB with both CPUs busy. Under -race every
// allocation carries the detector's shadow memory: the live heap keeps its
// bound, the resident set gets three times its bound (measured: 2.1 times
// the resident set of a run without it).
func TestFranzSourceMemory(t *testing.T) {
	const records, partitions = 600_000, 12
	const share = 8 << 20
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	checkShape(t, topic, produceShaped(t, topic, records))

	watch := &shapeWatch{Handler: kafkatest.Logger(t).Handler()}
	// One broker: one fetch at a time, so k = 1 makes the bound tight.
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, franz.Logger(slog.New(watch)),
		franz.ClientOptions(kgo.MaxConcurrentFetches(1)))
	if err != nil {
		t.Fatal(err)
	}
	limits := runner.FetchLimits{Bytes: share, PartitionBytes: 512 << 10, MinRecordBytes: memMinRecordBytes, MaxCompression: memMaxCompression}
	if err := src.LimitFetch(limits); err != nil {
		t.Fatal(err)
	}
	sink := &flapSink{src: src, resume: make(chan runner.TP, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case tp := <-sink.resume:
				select {
				case <-time.After(30 * time.Millisecond):
				case <-ctx.Done():
					return
				}
				src.Resume([]runner.TP{tp})
			case <-ctx.Done():
				return
			}
		}
	}()
	mem := newMemSampler(t)
	runDone := make(chan error, 1)
	go func() { runDone <- src.Run(ctx, sink) }()
	// 12 s of load, longer on a loaded machine until half the records
	// went through (the check below that the source was under load), for
	// at most a minute.
	stop, limit := time.Now().Add(12*time.Second), time.Now().Add(time.Minute)
	for n := sink.handled.Load(); n < records && (time.Now().Before(stop) || n < records/2 && time.Now().Before(limit)); n = sink.handled.Load() {
		mem.sample()
		time.Sleep(50 * time.Millisecond)
	}
	// Everything consumed (or nearly): what stays is the fixed state.
	waitIdle := time.Now().Add(5 * time.Second)
	for sink.handled.Load() < records && time.Now().Before(waitIdle) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // FetchMaxWait is 500ms: the last fetches are answered empty
	runtime.GC()
	idle := "not reached"
	if sink.handled.Load() == records {
		idle = fmt.Sprintf("%.2f MiB", mib(mem.liveHeap()-min(mem.liveHeap(), mem.baseHeap)))
	}
	src.Close()
	cancel()
	wg.Wait()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}

	const fetchMem = share * 7 / 8 / 2 // F * E for k = 1
	heapBound := uint64(share + fetchMem + 1<<20)
	rssBound := uint64(2*(share+1<<20) + 8<<20)
	if raceDetector {
		rssBound *= 3
	}
	t.Logf("handled %d records; max live heap growth %.1f MiB (bound %.1f), once all consumed %s; max RSS growth %.1f MiB (bound %.1f)",
		sink.handled.Load(), mib(mem.maxHeap), mib(heapBound), idle, mib(mem.maxRSS), mib(rssBound))
	switch {
	case watch.outside.Load():
		t.Fatal("the adapter saw records outside the stated shape: the test would not test the bound")
	case sink.handled.Load() < records/2:
		t.Fatalf("only %d records handed over: the source was not under load", sink.handled.Load())
	case mem.maxHeap > heapBound:
		t.Fatalf("live heap grew %.1f MiB, above the source's share, one fetch and its fixed state (%.1f MiB)", mib(mem.maxHeap), mib(heapBound))
	case mem.maxRSS > rssBound:
		t.Fatalf("resident set grew %.1f MiB, above %.1f MiB", mib(mem.maxRSS), mib(rssBound))
	}
}

// TestBoundedMemory: a backlog and a slow handler over the franz adapter.
// Every partition's buffered plus in-flight records stay at or under the
// high water mark, and what the process holds stays under the byte cap plus
// a constant (invariant 6): the live heap as the last collection found it,
// and the process's resident memory. In "small records" (1,000,000 records
// of about 14 bytes) the record water marks bind; in "1 KiB records" the
// byte limits do: the byte water marks (12 partitions × 768 KiB) and, first,
// the runner's share of the cap, which it charges with what each record
// costs beside its bytes. TestBoundedMemoryKafkago is its twin.
//
// The records are what the bound assumes (runner.RecordShape: at least
// minRecord bytes uncompressed, snappy, compressed at most 4 times), in
// batches of at most memBatchBytes (4 KiB), below the fetch size the
// adapter derives (docs/adapters.md: F = 7/8 · 4 MiB / (2k · E), k = 3,
// E = 79 for small records and 6.2 for 1 KiB ones: 7.6 KiB and 97 KiB),
// since a broker sends a larger batch whole.
//
// The bound is the cap plus memSlack (1 MiB). The runner charges every
// record it holds within its share and keeps headroom for a hand-over
// (docs/runner.md), and the adapter keeps its fetches, the poll it hands
// over and its parked records within FetchLimits.Bytes (docs/adapters.md).
// So above the cap comes only what does not grow with the records — the
// runner's per-partition constants (runner.PartitionOverhead, 3 KiB, x12)
// and the fixed state of the client and the adapter (metadata, cursors, the
// fetch session, connections, maps: 0.1 MiB in TestFranzSourceMemory) —
// and what the client's fetch goroutine decodes while the measuring
// collection marks, which counts as live in that cycle: one fetch,
// F · E = 7/8 · 4 MiB / 6, 0.6 MiB. Together 0.75 MiB. The resident set
// also holds the heap's garbage between collections (GOGC=100: up to as
// much again) and goroutine stacks: its bound is twice the heap's, three
// times that under the race detector, whose shadow memory is resident.
func TestBoundedMemory(t *testing.T) {
	boundedMemory(t, func(t *testing.T, group, topic string) (runner.Source, func(t *testing.T)) {
		watch := &shapeWatch{Handler: kafkatest.Logger(t).Handler()}
		src, err := franz.New(bed.Kafka(t), group, []string{topic}, franz.Logger(slog.New(watch)))
		if err != nil {
			t.Fatal(err)
		}
		return src, func(t *testing.T) {
			if watch.outside.Load() {
				t.Fatal("the adapter saw records outside the stated shape: the test would not test the bound")
			}
		}
	})
}

// boundedMemory is TestBoundedMemory and TestBoundedMemoryKafkago: a backlog
// of records of the stated shape on 12 partitions, a slow handler, a 16 MiB
// cap. newSource makes the adapter for a subtest and returns a check of its
// own that runs after the measurement (nil for none).
func boundedMemory(t *testing.T, newSource func(t *testing.T, group, topic string) (runner.Source, func(t *testing.T))) {
	const partitions, byteCap = 12, 16 << 20
	tests := []struct {
		name      string
		records   int
		value     int // bytes; 0: strconv.Itoa(i)
		minRecord int
		high, low int           // records
		highBytes int64         // ByteWaterMarks' high; low is half
		handler   time.Duration // per record; 32 at a time
	}{
		{name: "small records", records: 1_000_000, minRecord: 16, high: 500, low: 250, highBytes: 1 << 20, handler: 2 * time.Millisecond},
		{name: "1 KiB records", records: 150_000, value: 1 << 10, minRecord: 1 << 10, high: 2000, low: 1000, highBytes: 768 << 10, handler: 5 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			heapBound := uint64(byteCap + memSlack)
			rssBound := 2 * heapBound
			if raceDetector {
				rssBound *= 3
			}
			topic := bed.Topic(t, partitions)
			group := bed.Group(t)
			produceSmallBatches(t, topic, tc.records, tc.value, func(i int) string { return "key-" + strconv.Itoa(i%10_000) })

			var handled atomic.Int64
			src, check := newSource(t, group, topic)
			mem := newMemSampler(t)
			_, settled := src.(runner.Settler)
			handler := tc.handler
			if settled {
				// A share source fetches slower than the group sources
				// (a round trip per poll): a handler 4 times slower
				// builds the backlog.
				handler *= 4
			}
			opts := []runner.Option{runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
				time.Sleep(handler)
				handled.Add(1)
				return nil
			}), runner.Concurrency(32), runner.WaterMarks(tc.high, tc.low), runner.MaxBufferedBytes(byteCap),
				runner.ByteWaterMarks(tc.highBytes, tc.highBytes/2), runner.RecordShape(tc.minRecord, 4),
				runner.Logger(kafkatest.Logger(t))}
			if settled {
				// A share group commits nothing, and refuses Block.
				opts = append(opts, runner.Failure(runner.Skip(3)))
			} else {
				opts = append(opts, runner.CommitInterval(10*time.Millisecond))
			}
			r, err := runner.New(src, opts...)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()

			// The resident set every sample (what an OOM killer reads),
			// the live heap, which costs a collection, every fifth.
			var maxBuffered, maxTotal, allPaused, somePaused int
			stop := time.Now().Add(15 * time.Second)
			for i := 0; time.Now().Before(stop); i++ {
				s := r.Stats()
				paused := 0
				for _, p := range s.Partitions {
					maxBuffered = max(maxBuffered, p.Buffered)
					if p.Paused {
						paused++
					}
				}
				if paused == partitions {
					allPaused++
				}
				if paused > 0 {
					somePaused++
				}
				maxTotal = max(maxTotal, s.Buffered)
				if i%5 == 0 {
					mem.sample()
				} else {
					mem.sampleRSS()
				}
				time.Sleep(20 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := r.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("handled %d of %d records in 15s; max buffered per partition %d (high %d), in all %d; every partition paused in %d samples, some in %d; max live heap growth %.1f MiB (bound %.1f), max RSS growth %.1f MiB (bound %.1f)",
				handled.Load(), tc.records, maxBuffered, tc.high, maxTotal, allPaused, somePaused, mib(mem.maxHeap), mib(heapBound), mib(mem.maxRSS), mib(rssBound))
			if check != nil {
				check(t)
			}
			if n := handled.Load(); n == 0 || n == int64(tc.records) {
				t.Fatalf("handled %d of %d records: the backlog did not last the 15s measured", n, tc.records)
			}
			if maxBuffered > tc.high {
				t.Fatalf("a partition held %d records, above the high water mark %d", maxBuffered, tc.high)
			}
			switch {
			case settled && somePaused == 0 && maxTotal < shareHeld/2:
				// A share source holds at most its sessions' polls,
				// fewer than fill every partition to its high mark, and
				// hands over nothing while any partition is paused: the
				// backlog shows as a partition paused, or the sessions'
				// hold nearly full.
				t.Fatalf("no partition was paused (at most %d records of one, high %d) and at most %d records were held, under half of the %d the share sessions hold at most: the slow handler did not build a backlog, so the bound was not tested", maxBuffered, tc.high, maxTotal, shareHeld)
			case !settled && allPaused == 0:
				t.Fatalf("never saw every partition paused (max buffered %d per partition, %d in all): the slow handler did not build a backlog, so the bound was not tested", maxBuffered, maxTotal)
			}
			if mem.maxHeap > heapBound {
				t.Errorf("live heap grew by %.1f MiB, above the bound %.1f MiB", mib(mem.maxHeap), mib(heapBound))
			}
			if mem.maxRSS > rssBound {
				t.Errorf("resident memory grew by %.1f MiB, above the bound %.1f MiB", mib(mem.maxRSS), mib(rssBound))
			}
		})
	}
}
