//go:build integration

package integration_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// TestCompactedTail: a compacted partition whose first batch lost its last
// records to the cleaner. The broker keeps such a batch's header (its last
// offset) when it drops records from it, so a fetch at the first missing
// offset answers with that same batch again, and with nothing else when the
// batch alone fills the fetch (or is the last of the log). An adapter must
// move its position past the batch's last offset, not past its last record:
// the group must commit the end offset, every record still in the log
// handled once. Before the kafkago adapter read batch headers itself (with
// kafka-go's decoder) its fetcher asked for the missing offset forever and
// the commit stayed there. franz-go reads the header; its subtest shows the
// adapters alike.
func TestCompactedTail(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	const value = 1000 // bytes: one batch of five is larger than the fetch sizes below
	topic := compactedTopic(t)
	cl := bed.Client(t, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(50*time.Millisecond),
		kgo.ProducerBatchCompression(kgo.NoCompression()))

	// X: k0..k9 at offsets 0-9, one batch; Y: k5..k9 again at 10-14 in a
	// later segment, so the cleaner drops X's last five; Z at 15 rolls Y's
	// segment, which makes it cleanable too.
	produceBatch(t, cl, "k", 0, 10, value)
	time.Sleep(compactedSegmentMS * 3 / 2 * time.Millisecond)
	produceBatch(t, cl, "k", 5, 10, value)
	time.Sleep(compactedSegmentMS * 3 / 2 * time.Millisecond)
	produceBatch(t, cl, "z", 0, 1, value)

	// Wait for the cleaner (log.cleaner.backoff.ms is 15 s by default), and
	// check with a plain fetch that the gap is at the tail of a batch: the
	// first batch still spans 0-9 but holds only 0-4.
	first := waitCompacted(t, cl, topic, 90*time.Second)
	t.Logf("after compaction the first batch spans %d-%d and holds offsets %v", first.base, first.last, first.offsets)
	end := bed.EndOffsets(t, topic)[0]
	if end != 16 {
		t.Fatalf("end offset %d, want 16", end)
	}

	adapters := map[string]func(group string) (runner.Source, error){
		"kafkago": func(group string) (runner.Source, error) {
			return kafkago.New(bed.Kafka(t), group, []string{topic},
				kafkago.SessionTimeout(6*time.Second), kafkago.RebalanceTimeout(10*time.Second),
				kafkago.HeartbeatInterval(500*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)),
				// Smaller than one batch: a fetch answers with one batch
				// only (KIP-74), so after 0-4 the broker sends X alone,
				// again.
				kafkago.MaxBytes(value), kafkago.MaxWait(100*time.Millisecond))
		},
		"franz": func(group string) (runner.Source, error) {
			return franz.New(bed.Kafka(t), group, []string{topic},
				franz.SessionTimeout(10*time.Second), franz.RebalanceTimeout(20*time.Second),
				franz.HeartbeatInterval(500*time.Millisecond), franz.Logger(kafkatest.Logger(t)),
				franz.ClientOptions(kgo.FetchMaxBytes(value), kgo.FetchMaxPartitionBytes(value), kgo.FetchMaxWait(100*time.Millisecond)))
		},
	}
	for _, name := range []string{"kafkago", "franz"} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			handled := map[int64]int{}
			group := bed.Group(t)
			src, err := adapters[name](group)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			m := runMember(t, "m", src, topic, func(ctx context.Context, rec runner.Record) error {
				mu.Lock()
				handled[rec.Offset]++
				mu.Unlock()
				return nil
			})
			waitCommitted(t, group, topic, map[int32]int64{0: end}, 30*time.Second)
			m.Stop(t)

			mu.Lock()
			defer mu.Unlock()
			want := []int64{0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15}
			var got []int64
			for off, n := range handled {
				got = append(got, off)
				if n != 1 {
					t.Errorf("offset %d handled %d times", off, n)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("handled offsets %v, want %v", got, want)
			}
		})
	}
}

// compactedSegmentMS is segment.ms of compactedTopic's topic.
const compactedSegmentMS = 500

// compactedTopic creates a one-partition compacted topic whose segments
// roll after compactedSegmentMS and are cleaned as soon as the cleaner
// looks, and deletes it in the test's cleanup.
func compactedTopic(t *testing.T) string {
	t.Helper()
	adm := bed.Admin(t)
	topic := bed.Name(t, "topic")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := func(s string) *string { return &s }
	resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{
		"cleanup.policy":            cfg("compact"),
		"segment.ms":                cfg(fmt.Sprint(compactedSegmentMS)),
		"min.cleanable.dirty.ratio": cfg("0.01"),
		"min.compaction.lag.ms":     cfg("0"),
	}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create compacted topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopic(ctx, topic); err != nil {
			t.Errorf("delete topic %s: %v", topic, err)
		}
	})
	for {
		listed, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = listed.Error()
		}
		if err == nil {
			return topic
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s has no leader: %v", topic, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// produceBatch produces the keys prefix<from>..prefix<to-1>, each with a
// value of size bytes, in one batch (one ProduceSync call, one partition).
func produceBatch(t *testing.T, cl *kgo.Client, prefix string, from, to, size int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "%s%d", prefix, i), Value: []byte(strings.Repeat("v", size))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// rawBatch is one record batch as the broker sent it: its header's base and
// last offsets and the offsets of the records it holds.
type rawBatch struct {
	base, last int64
	offsets    []int64
}

// waitCompacted fetches the partition from offset 0 until its first batch
// spans offsets 0-9 but holds only 0-4 (the cleaner dropped its tail), and
// returns it.
func waitCompacted(t *testing.T, cl *kgo.Client, topic string, within time.Duration) rawBatch {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		b, err := firstBatch(cl, topic)
		if err == nil && b.base == 0 && b.last == 9 && slices.Equal(b.offsets, []int64{0, 1, 2, 3, 4}) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cleaner did not drop the first batch's tail within %v: first batch %+v, err %v", within, b, err)
		}
		time.Sleep(time.Second)
	}
}

// firstBatch sends one fetch at offset 0 and decodes the first batch's
// header and records itself (franz-go's client hides the header).
func firstBatch(cl *kgo.Client, topic string) (rawBatch, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxBytes = 1 << 20
	req.IsolationLevel = 1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	// Fetch v13 and later name topics by id; the client picks the version.
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		return rawBatch{}, err
	}
	rt.TopicID = md.Topics[topic].ID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = 0
	rp.FetchOffset = 0
	rp.PartitionMaxBytes = 1 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	// Fetches must go to the leader: the bed has one broker.
	resp, err := req.RequestWith(ctx, cl.Broker(1))
	if err != nil {
		return rawBatch{}, err
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return rawBatch{}, fmt.Errorf("fetch answered %d topics", len(resp.Topics))
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerrOf(p.ErrorCode); err != nil {
		return rawBatch{}, err
	}
	var rb kmsg.RecordBatch
	if err := rb.ReadFrom(p.RecordBatches); err != nil {
		return rawBatch{}, fmt.Errorf("first batch: %w", err)
	}
	if rb.Attributes&0x7 != 0 {
		return rawBatch{}, fmt.Errorf("first batch is compressed (attributes %#x)", rb.Attributes)
	}
	out := rawBatch{base: rb.FirstOffset, last: rb.FirstOffset + int64(rb.LastOffsetDelta)}
	recs := rb.Records
	for range rb.NumRecords {
		var r kmsg.Record
		if err := r.ReadFrom(recs); err != nil {
			return out, fmt.Errorf("record: %w", err)
		}
		out.offsets = append(out.offsets, rb.FirstOffset+int64(r.OffsetDelta))
		recs = recs[r.Length+int32(varintLen(int64(r.Length))):]
	}
	return out, nil
}

func kerrOf(code int16) error {
	if code == 0 {
		return nil
	}
	return fmt.Errorf("fetch error code %d", code)
}

// varintLen is the length of v as a zigzag varint.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}
