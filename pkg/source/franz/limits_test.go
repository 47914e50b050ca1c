package franz_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// fetchSizes records the MaxBytes and partition MaxBytes of the fetch
// requests the cluster gets.
type fetchSizes struct {
	mu               sync.Mutex
	first, max, part int32
	seen             int
}

func observeFetches(c *kafkatest.Cluster) *fetchSizes {
	fs := &fetchSizes{}
	c.Fake.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.Fake.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if len(req.Topics) == 0 && fs.seen == 0 {
			return nil, nil, false // nothing assigned yet
		}
		// An incremental fetch (KIP-227) names only changed partitions.
		if fs.seen == 0 {
			fs.first = req.MaxBytes
		}
		fs.max = req.MaxBytes
		fs.seen++
		for _, t := range req.Topics {
			for _, p := range t.Partitions {
				fs.part = p.PartitionMaxBytes
			}
		}
		return nil, nil, false
	})
	return fs
}

func (fs *fetchSizes) firstMax() int32 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.first
}

func (fs *fetchSizes) last() (max, part int32, seen int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.max, fs.part, fs.seen
}

// TestLimitFetch: the fetch sizes the client sends are derived from the
// source's share of MaxBufferedBytes and the record shape — FetchMaxBytes =
// 7/8 of the share / (2k * E), E = 1 + C + C*(sizeof(kgo.Record) +
// sizeof(runner.Record))/S, the partition's = its byte room / C — and
// replace the fetch sizes given in ClientOptions. k is MaxConcurrentFetches
// or, once the client knows the cluster, its number of brokers if fewer:
// each broker has at most one fetch out or buffered.
func TestLimitFetch(t *testing.T) {
	t.Parallel()
	structs := float64(unsafe.Sizeof(kgo.Record{}) + unsafe.Sizeof(runner.Record{}))
	defaults := runner.FetchLimits{Bytes: 64 << 20, PartitionBytes: 8 << 20, MinRecordBytes: 64, MaxCompression: 4}
	cases := []struct {
		name    string
		brokers int
		opts    []kgo.Opt
		limits  runner.FetchLimits
		k       float64
	}{
		{"defaults, three brokers", 3, nil, defaults, 3},
		{"defaults, one broker", 1, nil, defaults, 1},
		{"two fetches, three brokers", 3, []kgo.Opt{kgo.MaxConcurrentFetches(2)}, defaults, 2},
		{"one fetch", 1, []kgo.Opt{kgo.MaxConcurrentFetches(1)}, runner.FetchLimits{Bytes: 4 << 20, PartitionBytes: 64 << 10, MinRecordBytes: 20, MaxCompression: 2}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := kafkatest.NewFake(t, kfake.NumBrokers(tc.brokers))
			c.CreateTopic("t", 1)
			produce(c, "t", 1, 10, 10)
			fs := observeFetches(c)
			opts := append([]kgo.Opt{kgo.FetchMaxBytes(50 << 20), kgo.FetchMaxPartitionBytes(10 << 20)}, tc.opts...)
			src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.ClientOptions(opts...))
			if err != nil {
				t.Fatal(err)
			}
			if err := src.LimitFetch(tc.limits); err != nil {
				t.Fatalf("LimitFetch: %v", err)
			}
			l := tc.limits
			e := 1 + l.MaxCompression + l.MaxCompression*structs/float64(l.MinRecordBytes)
			size := func(k float64) int32 { return int32(float64(l.Bytes-l.Bytes/8) / (2 * k * e)) }
			wantMax := size(tc.k)
			wantPart := min(wantMax, int32(float64(l.PartitionBytes)/l.MaxCompression))
			sink := &chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 100)}
			runSource(t, src, sink)
			// The first fetches may go out before the client knows the
			// brokers, sized for MaxConcurrentFetches: smaller, never
			// larger.
			kafkatest.WaitFor(t, 15*time.Second, "a fetch of the derived size", func() bool {
				max, part, n := fs.last()
				if n > 0 && max > wantMax {
					t.Fatalf("fetch MaxBytes %d, above the %d that %g concurrent fetches allow", max, wantMax, tc.k)
				}
				if n > 0 && max == wantMax && part == wantPart {
					return true
				}
				produce(c, "t", 1, 1, 1) // ends a fetch waiting with the earlier size
				return false
			})
		})
	}
}

// TestLimitFetchRefuses: a share too small for a 1 KiB fetch, bad limits,
// limits set after Run, and an unbounded kgo.MaxConcurrentFetches are
// errors that say what is wrong; runner.New reports the first as a
// *runner.ConfigError for MaxBufferedBytes.
func TestLimitFetchRefuses(t *testing.T) {
	t.Parallel()
	shape := runner.FetchLimits{Bytes: 64 << 20, PartitionBytes: 8 << 20, MinRecordBytes: 64, MaxCompression: 4}
	small := shape
	small.Bytes = 64 << 10
	src := benchSourceT(t)
	if err := src.LimitFetch(small); err == nil || !strings.Contains(err.Error(), "raise MaxBufferedBytes") {
		t.Errorf("LimitFetch with a 64 KiB share: %v, want an error saying to raise MaxBufferedBytes", err)
	}
	bad := shape
	bad.MinRecordBytes = 0
	if err := src.LimitFetch(bad); err == nil {
		t.Error("LimitFetch accepted records of 0 bytes")
	}
	_, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
		runner.MaxBufferedBytes(16<<20), runner.ByteWaterMarks(1<<20, 512<<10), runner.RecordShape(1, 100))
	var ce *runner.ConfigError
	if !errors.As(err, &ce) || ce.Option != "MaxBufferedBytes" {
		t.Errorf("runner.New with a share too small for the record shape: %v, want a *runner.ConfigError for MaxBufferedBytes", err)
	}
	_, err = franz.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.ClientOptions(kgo.MaxConcurrentFetches(-1)))
	if !errors.As(err, new(*franz.ConfigError)) || !strings.Contains(err.Error(), "MaxConcurrentFetches") {
		t.Errorf("New with unbounded concurrent fetches: %v, want a *ConfigError naming MaxConcurrentFetches", err)
	}

	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	run, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	sink := &chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 100)}
	runSource(t, run, sink)
	select {
	case <-sink.assigned:
	case <-time.After(15 * time.Second):
		t.Fatal("no assignment")
	}
	if err := run.LimitFetch(shape); err == nil {
		t.Error("LimitFetch after Run succeeded")
	}
}

// TestFetchLoweredForSmallerRecords: when fetched batches expand more than
// the stated record shape allows (records smaller than stated), later
// fetches are made smaller in proportion, so the bound holds with the
// expansion seen; fetches are never made larger than LimitFetch set.
func TestFetchLoweredForSmallerRecords(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t)
	c.CreateTopic("t", 1)
	produce(c, "t", 1, 100, 10) // records of about 10 bytes
	fs := observeFetches(c)
	// One concurrent fetch, so that only the expansion seen changes the
	// size (not the number of brokers: see TestLimitFetch).
	src, err := franz.New(c.Brokers(), "g", []string{"t"}, franz.Logger(kafkatest.Logger(t)), franz.ClientOptions(kgo.MaxConcurrentFetches(1)))
	if err != nil {
		t.Fatal(err)
	}
	// Records of at least 10,000 bytes, uncompressed: E is about 2.
	if err := src.LimitFetch(runner.FetchLimits{Bytes: 8 << 20, PartitionBytes: 1 << 20, MinRecordBytes: 10000, MaxCompression: 1}); err != nil {
		t.Fatal(err)
	}
	sink := &chanSink{assigned: make(chan []runner.Assignment, 10), batches: make(chan runner.Batch, 100)}
	runSource(t, src, sink)
	kafkatest.WaitFor(t, 15*time.Second, "a fetch", func() bool { _, _, n := fs.last(); return n > 0 })
	first := fs.firstMax()
	got := map[runner.TP][]int64{}
	takeBatches(sink.batches, got, 10*time.Second, func() bool { return len(got[runner.TP{Topic: "t"}]) == 100 }, func(runner.Batch) {})
	produce(c, "t", 1, 1, 1) // ends the fetch that may be waiting with the old size
	kafkatest.WaitFor(t, 10*time.Second, "a smaller fetch", func() bool { max, _, _ := fs.last(); return max < first })
	max, part, _ := fs.last()
	// About 100 records of 10 bytes in one batch: (1,000 + 100 * 296) /
	// (1,000 + 61), some 14 times the stated 2.
	if max > first/5 || part > max {
		t.Fatalf("fetch MaxBytes %d (partition %d) after small records; want at most a fifth of the first %d", max, part, first)
	}
}
