package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// sizedDLQ is a dead-letter topic with a max.message.bytes: it refuses a
// record whose key, value and headers exceed max, as a broker does, with
// a *runner.RefusedError.
type sizedDLQ struct {
	mu      sync.Mutex
	max     int
	tries   []int // the size of every write
	written []runner.Record
}

func size(rec runner.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (d *sizedDLQ) WriteDeadLetter(_ context.Context, _ string, rec runner.Record) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := size(rec)
	d.tries = append(d.tries, n)
	if n > d.max {
		return fmt.Errorf("dlq: %w", &runner.RefusedError{Err: fmt.Errorf("MESSAGE_TOO_LARGE: %d bytes", n)})
	}
	d.written = append(d.written, rec)
	return nil
}

// deadLetterThrough runs rec, whose handler fails, through a runner
// dead-lettering to d, and returns once the commit passed it.
func deadLetterThrough(t *testing.T, d runner.DeadLetterWriter, rec runner.Record) {
	t.Helper()
	src := runnertest.New()
	src.Append(rec)
	r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
		return runner.Permanent(errors.New("poison"))
	}), runner.Failure(runner.DeadLetter("t.dlq", 1, d)), runner.CommitInterval(time.Millisecond))
	started(t, r)
	assign(t, src, tp(0))
	await(t, time.Minute, "the commit passes the dead-lettered record", committedAt(src, 0, rec.Offset+1))
}

// TestDeadLetterOfALargeKey: a record the broker accepted — a 600 KiB key,
// a 100 KiB value, under the broker's default message.max.bytes of about
// 1 MiB — must be writable as a dead letter. The origin key header carries
// a hash of a key that large, not a second copy, so the dead letter is the
// record plus a few KiB of headers, and the first write goes through.
func TestDeadLetterOfALargeKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		key := bytes.Repeat([]byte("k"), 600<<10)
		rec := runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: key, Value: bytes.Repeat([]byte("v"), 100<<10)}
		d := &sizedDLQ{max: 1048588}
		deadLetterThrough(t, d, rec)
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.tries) != 1 || len(d.written) != 1 {
			t.Fatalf("writes of sizes %v, want one accepted at once", d.tries)
		}
		dl := d.written[0]
		if extra := size(dl) - size(rec); extra > 8<<10 {
			t.Errorf("the dead letter is %d bytes larger than the record, want at most 8 KiB of headers", extra)
		}
		if _, ok := dl.Header(runner.HeaderOriginKey); ok {
			t.Errorf("%s copies a 600 KiB key", runner.HeaderOriginKey)
		}
		sum := sha256.Sum256(key)
		if h, _ := dl.Header(runner.HeaderOriginKeySHA256); string(h) != hex.EncodeToString(sum[:]) {
			t.Errorf("%s = %q, want the key's SHA-256", runner.HeaderOriginKeySHA256, h)
		}
		if !bytes.Equal(dl.Key, key) || len(dl.Value) != 100<<10 {
			t.Errorf("the dead letter lost the record's key or value")
		}
	})
}

// TestDeadLetterRefusedIsCut: a dead-letter topic whose max.message.bytes
// is under the record refuses it for good; the runner then writes it
// without the value and the record's own headers, then without the key,
// and the partition goes on.
func TestDeadLetterRefusedIsCut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   int
		tries int
		cut   string
		key   bool
	}{
		{"without the value", 4 << 10, 2, "value,headers", true},
		{"without the key too", 1 << 10, 3, "value,headers,key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := runner.Record{Topic: topic, Partition: 0, Offset: 7, Key: bytes.Repeat([]byte("k"), 2<<10),
					Value: bytes.Repeat([]byte("v"), 8<<10), Headers: []runner.Header{{Key: "trace", Value: bytes.Repeat([]byte("t"), 1<<10)}}}
				d := &sizedDLQ{max: tc.max}
				deadLetterThrough(t, d, rec)
				d.mu.Lock()
				defer d.mu.Unlock()
				if len(d.tries) != tc.tries || len(d.written) != 1 {
					t.Fatalf("writes of sizes %v, %d accepted; want %d tries, the last accepted", d.tries, len(d.written), tc.tries)
				}
				dl := d.written[0]
				if c, _ := dl.Header(runner.HeaderDeadLetterCut); string(c) != tc.cut {
					t.Errorf("%s = %q, want %q", runner.HeaderDeadLetterCut, c, tc.cut)
				}
				if r, _ := dl.Header(runner.HeaderDeadLetterRefused); !bytes.Contains(r, []byte("MESSAGE_TOO_LARGE")) {
					t.Errorf("%s = %q, want the refusal", runner.HeaderDeadLetterRefused, r)
				}
				if dl.Value != nil || (dl.Key != nil) != tc.key {
					t.Errorf("value %d bytes, key %d bytes; want no value, key kept %v", len(dl.Value), len(dl.Key), tc.key)
				}
				if _, ok := dl.Header("trace"); ok {
					t.Errorf("the record's own header is still there")
				}
				if o, ok, err := runner.OriginOf(dl.Headers); !ok || err != nil || o.Offset != 7 {
					t.Errorf("origin %v %v %v, want t/0@7", o, ok, err)
				}
				for _, k := range []string{runner.HeaderError, runner.HeaderAttempts, runner.HeaderErrorKind} {
					if _, ok := dl.Header(k); !ok {
						t.Errorf("header %s is missing", k)
					}
				}
			})
		})
	}
}

// TestDeadLetterRefusedForGoodHolds: when even the cut dead letter is
// refused, the record holds its partition (nothing is lost), the write is
// retried with backoff, not in a loop, and the status shows why.
func TestDeadLetterRefusedForGoodHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("k"), Value: []byte("v")})
		d := &sizedDLQ{max: 10}
		r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error {
			return runner.Permanent(errors.New("poison"))
		}), runner.Failure(runner.DeadLetter("t.dlq", 1, d)), runner.CommitInterval(time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		time.Sleep(time.Minute)
		synctest.Wait()
		d.mu.Lock()
		tries := len(d.tries)
		d.mu.Unlock()
		if tries < 4 || tries > 40 {
			t.Fatalf("%d writes in a minute, want a few: the cut ones, then retries with backoff", tries)
		}
		if got, ok := src.Committed(tp(0)); ok && got > 0 {
			t.Fatalf("committed %d past a record never written anywhere", got)
		}
		st := r.Stats()
		if len(st.Partitions) != 1 || !bytes.Contains([]byte(st.Partitions[0].OldestError), []byte("dead-letter write refused")) {
			t.Fatalf("status %+v, want the oldest record's error to say the dead letter is refused", st.Partitions)
		}
	})
}
