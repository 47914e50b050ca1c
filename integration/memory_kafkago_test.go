//go:build integration

package integration_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
	"github.com/tidemark/tidemark/pkg/source/share"
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
	boundedMemory(t, func(t *testing.T, group, topic string) (runner.Source, func(t *testing.T)) {
		src, err := kafkago.New(bed.Kafka(t), group, []string{topic}, kafkago.Logger(kafkatest.Logger(t)))
		if err != nil {
			t.Fatal(err)
		}
		return src, nil
	})
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
	// 150 MB (the 1 KiB case) to a broker that the tests beside this one
	// keep busy can take minutes on two cores.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The first error: errors of different types, so not an atomic.Value.
	var failed atomic.Pointer[error]
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
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("produce %d records to %s: flush: %v", n, topic, err)
	}
	if err := failed.Load(); err != nil {
		t.Fatalf("produce %d records to %s: %v", n, topic, *err)
	}
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

// TestBoundedMemoryShare is TestBoundedMemory over the share source: the
// same backlog and slow handler, read by a share group of four sessions
// (the default). The runner pauses a partition at its high water mark,
// and the sessions hand over nothing while it is paused and fetch at most
// what LimitFetch leaves each (the cap's fetch share over twice the
// sessions), so the bound is the same: the cap plus memSlack. Records wait
// in the sessions (MaxPollRecords each, handed over as the budget allows)
// within that fetch share.
func TestBoundedMemoryShare(t *testing.T) {
	boundedMemory(t, func(t *testing.T, group, topic string) (runner.Source, func(t *testing.T)) {
		src, err := share.New(bed.Kafka(t), group, []string{topic},
			share.GroupConfig("share.auto.offset.reset", "earliest"),
			// Renewals every 5s: the handler's backlog holds records for
			// seconds, and a loaded machine must not let locks run out
			// (the records would only be delivered again, not lost).
			share.GroupConfig("share.record.lock.duration.ms", "15000"),
			share.Logger(kafkatest.Logger(t)))
		if err != nil {
			t.Fatal(err)
		}
		return src, nil
	})
}

// shareHeld is the most records TestBoundedMemoryShare's source holds at
// once: its default 4 sessions of 512.
const shareHeld = 4 * 512
