package kafkago_test

import (
	"context"
	"log/slog"
	"math"
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
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// fetchSizes records the PartitionMaxBytes of every fetch request for
// topic, in order, and of each partition's first.
type fetchSizes struct {
	mu    sync.Mutex
	sizes []int32
	first map[int32]int32
}

func watchSizes(c *kafkatest.Cluster, topic string) *fetchSizes {
	fs := &fetchSizes{first: map[int32]int32{}}
	c.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		for _, rt := range req.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if rt.Topic == topic {
					fs.sizes = append(fs.sizes, rp.PartitionMaxBytes)
					if _, ok := fs.first[rp.Partition]; !ok {
						fs.first[rp.Partition] = rp.PartitionMaxBytes
					}
				}
			}
		}
		return nil, nil, false
	})
	return fs
}

func (fs *fetchSizes) seen() []int32 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]int32(nil), fs.sizes...)
}

// runFor runs a runner over src with opts until cond holds, then shuts it
// down.
func runFor(t *testing.T, src runner.Source, topic string, cond func() bool, opts ...runner.Option) {
	t.Helper()
	m := kafkatest.Start(t, "", src, 10*time.Second, append([]runner.Option{runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(20 * time.Millisecond)}, opts...)...)
	kafkatest.WaitFor(t, 10*time.Second, "the condition", cond)
	m.Stop(t)
}

func newSource(t *testing.T, c *kafkatest.Cluster, topic string, opts ...kafkago.Option) *kafkago.Source {
	t.Helper()
	src, err := kafkago.New(c.Brokers(), "g", []string{topic}, append([]kafkago.Option{
		kafkago.SessionTimeout(2 * time.Second), kafkago.RebalanceTimeout(3 * time.Second),
		kafkago.HeartbeatInterval(100 * time.Millisecond), kafkago.MaxWait(50 * time.Millisecond),
		kafkago.Logger(kafkatest.Logger(t))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return src
}

// TestLimitFetch: the runner's share for the source (a quarter of
// MaxBufferedBytes) sets the fetch size of each partition to
// Bytes / (partitions · E), with E = 1 + 2·C + C·sizeof(runner.Record)/S
// the most a fetch keeps per wire byte (docs/adapters.md), capped by
// MaxBytes and by the byte water marks' gap over C. Before, the adapter took no limits and fetched MaxBytes
// (1 MiB) per partition whatever the cap.
func TestLimitFetch(t *testing.T) {
	t.Parallel()
	const partitions = 6
	e := func(minBytes int, c float64) float64 {
		return 1 + 2*c + c*float64(unsafe.Sizeof(runner.Record{}))/float64(minBytes)
	}
	tests := []struct {
		name      string
		maxBytes  int64 // MaxBufferedBytes
		high, low int64 // ByteWaterMarks
		minRec    int
		comp      float64
		want      int32
	}{
		{"defaults' shape, a 64 MiB cap", 64 << 20, 16 << 20, 8 << 20, 64, 4, int32(math.Floor(float64(16<<20) / (partitions * e(64, 4))))},
		{"large records, no compression", 64 << 20, 16 << 20, 8 << 20, 4096, 1, int32(math.Floor(float64(16<<20) / (partitions * e(4096, 1))))},
		{"capped by MaxBytes", 1 << 30, 16 << 20, 8 << 20, 1024, 1, 1 << 20},
		{"capped by the byte water marks", 1 << 30, 1 << 20, 512 << 10, 1024, 2, 256 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := kafkatest.NewFake(t, kfake.SeedTopics(partitions, "sized"))
			produce(c, "sized", partitions, 3)
			sizes := watchSizes(c, "sized")
			src := newSource(t, c, "sized")
			runFor(t, src, "sized", func() bool {
				sizes.mu.Lock()
				defer sizes.mu.Unlock()
				return len(sizes.first) == partitions
			},
				runner.MaxBufferedBytes(tc.maxBytes), runner.ByteWaterMarks(tc.high, tc.low), runner.RecordShape(tc.minRec, tc.comp))
			sizes.mu.Lock()
			defer sizes.mu.Unlock()
			for p, got := range sizes.first {
				if got != tc.want {
					t.Errorf("partition %d's first fetch asked for %d bytes, want %d (MaxBufferedBytes %d, RecordShape(%d, %g))", p, got, tc.want, tc.maxBytes, tc.minRec, tc.comp)
				}
			}
		})
	}
}

// TestLimitFetchShrinks: records far smaller than RecordShape states make
// a fetch keep more than the limits allow per wire byte; the next fetch
// asks for less, in proportion, and a warning says why.
func TestLimitFetchShrinks(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "tiny"))
	var recs []*kgo.Record
	for range 3000 {
		recs = append(recs, &kgo.Record{Topic: "tiny", Value: []byte("v")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	sizes := watchSizes(c, "tiny")
	var logs kafkatest.LogBuffer
	src := newSource(t, c, "tiny", kafkago.Logger(logs.Logger(slog.LevelWarn)))
	runFor(t, src, "tiny", func() bool { return len(sizes.seen()) >= 2 },
		runner.MaxBufferedBytes(16<<20), runner.WaterMarks(1000, 500), runner.ByteWaterMarks(1<<20, 512<<10), runner.RecordShape(1024, 1))
	got := sizes.seen()
	if got[1] >= got[0] {
		t.Fatalf("fetch sizes %v: the second fetch did not ask for less after the first kept ~140 bytes per 1-byte record", got)
	}
	if !strings.Contains(logs.String(), "lowering the fetch size") {
		t.Errorf("no warning about the lowered fetch size; log:\n%s", logs.String())
	}
	t.Logf("fetch sizes %v", got)
}

// TestLimitFetchRejects: limits the adapter cannot meet are an error that
// names the field.
func TestLimitFetchRejects(t *testing.T) {
	t.Parallel()
	src, err := kafkago.New([]string{"127.0.0.1:1"}, "g", []string{"t"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, tc := range []struct {
		l    runner.FetchLimits
		want string
	}{
		{runner.FetchLimits{Bytes: 0, MinRecordBytes: 64, MaxCompression: 4}, "Bytes"},
		{runner.FetchLimits{Bytes: 1 << 20, MinRecordBytes: 0, MaxCompression: 4}, "MinRecordBytes"},
		{runner.FetchLimits{Bytes: 1 << 20, MinRecordBytes: 64, MaxCompression: 0.5}, "MaxCompression"},
		{runner.FetchLimits{Bytes: 1 << 20, MinRecordBytes: 64, MaxCompression: math.NaN()}, "MaxCompression"},
	} {
		if err := src.LimitFetch(tc.l); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LimitFetch(%+v) = %v, want an error naming %s", tc.l, err, tc.want)
		}
	}
	if err := src.LimitFetch(runner.FetchLimits{Bytes: 1 << 20, MinRecordBytes: 64, MaxCompression: 4}); err != nil {
		t.Errorf("LimitFetch of valid limits: %v", err)
	}
}

// unlimited hides the Source's LimitFetch from the runner.
type unlimited struct{ runner.Source }

// TestNoLimitsFetchMaxBytes: a Source the runner did not limit fetches
// MaxBytes every time, whatever its records keep.
func TestNoLimitsFetchMaxBytes(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "free"))
	produce(c, "free", 1, 500)
	sizes := watchSizes(c, "free")
	src := newSource(t, c, "free", kafkago.MaxBytes(64<<10))
	runFor(t, unlimited{src}, "free", func() bool { return len(sizes.seen()) >= 3 })
	for i, got := range sizes.seen() {
		if got != 64<<10 {
			t.Fatalf("fetch %d asked for %d bytes, want MaxBytes %d", i, got, 64<<10)
		}
	}
}
