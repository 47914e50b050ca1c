//go:build integration

package integration_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
)

// readDeadLetters reads the n records of the dead-letter topic dlq.
func readDeadLetters(t *testing.T, dlq string, n int) []*kgo.Record {
	t.Helper()
	rd := bed.Client(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(8<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := rd.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatalf("reading the dead-letter topic (%d of %d read): %v", len(recs), n, err)
		}
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func header(r *kgo.Record, key string) (string, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value), true
		}
	}
	return "", false
}

// deadLetterOne produces rec to a new topic, runs a member whose handler
// refuses every record, dead-lettering to dlq, waits until the commit
// passed the record and returns its dead letter.
func deadLetterOne(t *testing.T, dlq string, rec *kgo.Record) *kgo.Record {
	t.Helper()
	topic, group := bed.Topic(t, 1), bed.Group(t)
	rec.Topic = topic
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bed.Client(t).ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatalf("producing the record: %v", err)
	}
	m := startMember(t, "m", group, topic, func(context.Context, runner.Record) error {
		return runner.Permanent(errors.New("poison"))
	}, runner.Failure(runner.DeadLetter(dlq, 1, nil)))
	defer m.Stop(t)
	waitCommitted(t, group, topic, map[int32]int64{0: 1}, time.Minute)
	return readDeadLetters(t, dlq, 1)[0]
}

// TestDeadLetterOfALargeKeyOnBroker: a record the broker took with a
// 600 KiB key and a 100 KiB value (under the default message.max.bytes of
// 1 MiB) is dead-lettered whole at once: its key is not copied into a
// header, which made the dead letter 1.33 MB, refused on every retry.
func TestDeadLetterOfALargeKeyOnBroker(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte("k"), 600<<10)
	dl := deadLetterOne(t, bed.Topic(t, 1), &kgo.Record{Key: key, Value: bytes.Repeat([]byte("v"), 100<<10)})
	if !bytes.Equal(dl.Key, key) || len(dl.Value) != 100<<10 {
		t.Fatalf("the dead letter has a %d-byte key and a %d-byte value, want the record's", len(dl.Key), len(dl.Value))
	}
	if _, ok := header(dl, runner.HeaderOriginKey); ok {
		t.Errorf("%s copies the 600 KiB key", runner.HeaderOriginKey)
	}
	if _, ok := header(dl, runner.HeaderOriginKeySHA256); !ok {
		t.Errorf("no %s", runner.HeaderOriginKeySHA256)
	}
	if _, cut := header(dl, runner.HeaderDeadLetterCut); cut {
		t.Errorf("the dead letter was cut: it fits whole")
	}
}

// TestDeadLetterCutToTheTopicsMaxMessageBytes: to a dead-letter topic
// whose max.message.bytes is 4 KiB, a record of 10 KiB cannot go whole
// (MESSAGE_TOO_LARGE from the broker): it is dead-lettered without its
// value and own headers, its origin and failure headers kept, and the
// commit passes it.
func TestDeadLetterCutToTheTopicsMaxMessageBytes(t *testing.T) {
	t.Parallel()
	dlq := bed.Topic(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := bed.Admin(t).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr("4096")}}, dlq)
	for _, r := range resp {
		if err == nil {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatalf("setting max.message.bytes of %s: %v", dlq, err)
	}
	// Random bytes: the producer compresses, and max.message.bytes is of
	// the compressed batch.
	value := make([]byte, 10<<10)
	rand.Read(value)
	dl := deadLetterOne(t, dlq, &kgo.Record{Key: []byte("small"), Value: value,
		Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t1")}}})
	if c, _ := header(dl, runner.HeaderDeadLetterCut); c != "value,headers" {
		t.Errorf("%s = %q, want value,headers", runner.HeaderDeadLetterCut, c)
	}
	if r, _ := header(dl, runner.HeaderDeadLetterRefused); !containsAll(r, "MESSAGE_TOO_LARGE") {
		t.Errorf("%s = %q, want the broker's MESSAGE_TOO_LARGE", runner.HeaderDeadLetterRefused, r)
	}
	if len(dl.Value) != 0 || string(dl.Key) != "small" {
		t.Errorf("dead letter %q=%d bytes, want key small and no value", dl.Key, len(dl.Value))
	}
	if _, ok := header(dl, "trace"); ok {
		t.Errorf("the record's own header is still there")
	}
	if o, _ := header(dl, runner.HeaderOriginOffset); o != "0" {
		t.Errorf("%s = %q, want 0", runner.HeaderOriginOffset, o)
	}
	if e, _ := header(dl, runner.HeaderError); !containsAll(e, "poison") {
		t.Errorf("%s = %q, want the handler's error", runner.HeaderError, e)
	}
}
