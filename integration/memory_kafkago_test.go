//go:build integration

package integration_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// TestBoundedMemoryKafkago is TestBoundedMemory over the kafkago adapter: a
// backlog and a slow handler. Every partition's buffered plus in-flight
// records stay at or under the high water mark, and what the process holds
// stays under the byte cap plus a constant (invariant 6): the live heap
// after a collection, and the process's resident memory. In "small records"
// (TestBoundedMemory's 1,000,000 records of about 14 bytes) the record
// water marks bind; in "1 KiB records" the byte limits do: the byte water
// marks (12 partitions × 768 KiB) and, first, the runner's share of the
// cap, which it charges with what each record costs beside its bytes.
//
// The records are what the bound assumes (runner.RecordShape: at least
// minRecord bytes uncompressed, snappy, compressed at most 4 times), and
// they are produced in batches of at most memBatchBytes, below the fetch
// size the adapter derives (docs/adapters.md: F = 4 MiB / (12 · E), E = 43
// for small records, 9.5 for 1 KiB ones: 8 KiB and 36 KiB), since a broker
// sends a larger batch whole.
//
// The bound is the cap plus memSlack for what is not records and does not
// grow with them: the runner charges every record it holds, payload and
// overhead, within its share (docs/runner.md), and the adapter keeps its
// fetches within the rest (docs/adapters.md), so above the cap come only
// the per-partition constants (runner.PartitionOverhead, 3 KiB, and the
// adapter's fetcher, ×12 here) and the fixed state of kafka-go's group and
// transports with their connections' read buffers: an idle consumer of 12
// partitions measured 0.3 MiB. memSlack is 1 MiB. The live heap is within
// the bound without the race detector and with it (the detector's shadow
// memory is outside the heap). Resident memory also holds the heap's
// garbage between collections (GOGC 100: up to as much again) and the
// goroutine stacks: its bound is twice the heap's, three times that under
// the race detector, whose shadow memory is resident.
func TestBoundedMemoryKafkago(t *testing.T) {
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
			heapBound := int64(byteCap + memSlack)
			rssBound := 2 * heapBound
			if raceDetector {
				rssBound *= 3
			}
			topic := bed.Topic(t, partitions)
			group := bed.Group(t)
			produceSmallBatches(t, topic, tc.records, tc.value, func(i int) string { return "key-" + strconv.Itoa(i%10_000) })

			var handled atomic.Int64
			src, err := kafkago.New(bed.Kafka(t), group, []string{topic}, kafkago.Logger(quietLogger()))
			if err != nil {
				t.Fatal(err)
			}
			// The baseline: what the producer left is collected and its
			// pages given back to the kernel, so that neither counts.
			debug.FreeOSMemory()
			heap0, rss0 := liveHeap(), residentBytes(t)
			r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
				time.Sleep(tc.handler)
				handled.Add(1)
				return nil
			}), runner.Concurrency(32), runner.WaterMarks(tc.high, tc.low), runner.MaxBufferedBytes(byteCap),
				runner.ByteWaterMarks(tc.highBytes, tc.highBytes/2), runner.RecordShape(tc.minRecord, 4),
				runner.CommitInterval(10*time.Millisecond), runner.Logger(quietLogger()))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()

			// The heap is measured live: right after a collection, above
			// the baseline taken before the runner started. Resident
			// memory is what an OOM killer reads.
			var maxBuffered, maxTotal, allPaused int
			var maxHeap, maxRSS int64
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
				maxTotal = max(maxTotal, s.Buffered)
				maxRSS = max(maxRSS, residentBytes(t)-rss0)
				if i%25 == 0 {
					maxHeap = max(maxHeap, liveHeap()-heap0)
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
			mib := func(n int64) float64 { return float64(n) / (1 << 20) }
			t.Logf("handled %d of %d records in 15s; max buffered per partition %d (high %d), in all %d; every partition paused in %d samples; max live heap growth %.1f MiB (bound %.1f), max RSS growth %.1f MiB (bound %.1f)",
				handled.Load(), tc.records, maxBuffered, tc.high, maxTotal, allPaused, mib(maxHeap), mib(heapBound), mib(maxRSS), mib(rssBound))
			if n := handled.Load(); n == 0 || n == int64(tc.records) {
				t.Fatalf("handled %d of %d records: the backlog did not last the 15s measured", n, tc.records)
			}
			if maxBuffered > tc.high {
				t.Fatalf("a partition held %d records, above the high water mark %d", maxBuffered, tc.high)
			}
			if allPaused == 0 {
				t.Fatalf("never saw every partition paused (max buffered %d per partition, %d in all): the slow handler did not build a backlog, so the bound was not tested", maxBuffered, maxTotal)
			}
			if maxHeap > heapBound {
				t.Errorf("live heap grew by %.1f MiB, above the bound %.1f MiB", mib(maxHeap), mib(heapBound))
			}
			if maxRSS > rssBound {
				t.Errorf("resident memory grew by %.1f MiB, above the bound %.1f MiB", mib(maxRSS), mib(rssBound))
			}
		})
	}
}

// memSlack is what TestBoundedMemoryKafkago allows above the cap.
const memSlack = 1 << 20

// memBatchBytes bounds the producer's batches in TestBoundedMemoryKafkago.
const memBatchBytes = 4 << 10

// produceSmallBatches is bed.Produce with batches of at most memBatchBytes
// and, when value is not 0, values of that many random bytes.
func produceSmallBatches(t *testing.T, topic string, n, value int, key func(i int) string) {
	t.Helper()
	// Not bed.Client: its cleanup would keep the client, and what it
	// buffered, reachable until the test ends, inside the baseline.
	cl, err := kgo.NewClient(kgo.SeedBrokers(bed.Kafka(t)...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchMaxBytes(memBatchBytes))
	if err != nil {
		t.Fatalf("new kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var failed atomic.Value
	random := make([]byte, 1<<20)
	rand.Read(random)
	for i := range n {
		v := []byte(strconv.Itoa(i))
		if value > 0 {
			off := (i * 7919) % (len(random) - value)
			v = random[off : off+value : off+value]
		}
		cl.Produce(ctx, &kgo.Record{Key: []byte(key(i)), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("produce %d records to %s: flush: %v", n, topic, err)
	}
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("produce %d records to %s: %v", n, topic, err)
	}
}

// liveHeap returns the heap in use right after a collection.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// residentBytes returns the process's resident memory (VmRSS).
func residentBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatalf("resident memory: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err != nil {
				t.Fatalf("resident memory: %q: %v", v, err)
			}
			return kib << 10
		}
	}
	t.Fatal("resident memory: no VmRSS in /proc/self/status")
	return 0
}
