//go:build integration

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestInboxBatchSameDedupKeyNeverFalseReplay: two records in flight together
// share a dedup key and the first one's effect fails. The second must not be
// reported done as a replay of it (found in review: one batch used to claim
// both rows in one statement); it is applied in its own transaction.
func TestInboxBatchSameDedupKeyNeverFalseReplay(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	tp := runner.TP{Topic: "t", Partition: 0}
	s := inboxStore(t, pool, "g", inbox.Batch(8), inbox.DedupHeader("message-id"))
	inboxTake(t, s, tp, -1)
	inGate, gate := make(chan struct{}), make(chan struct{})
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if rec.Offset == 0 {
			close(inGate)
			<-gate
		}
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		if rec.Offset == 1 {
			return errors.New("transient failure of offset 1")
		}
		return nil
	})
	withID := func(r runner.Record, id string) runner.Record {
		r.Headers = []runner.Header{{Key: "message-id", Value: []byte(id)}}
		return r
	}
	var wg sync.WaitGroup
	res := make([]error, 3)
	wg.Add(1)
	go func() { defer wg.Done(); res[0] = h(ctx, inboxRec("t", 0, 0)) }()
	<-inGate
	for _, off := range []int64{1, 2} {
		wg.Add(1)
		go func() { defer wg.Done(); res[off] = h(ctx, withID(inboxRec("t", 0, off), "m-x")) }()
		time.Sleep(50 * time.Millisecond) // 1 queues before 2
	}
	close(gate)
	wg.Wait()
	t.Logf("results: 0=%v 1=%v 2=%v", res[0], res[1], res[2])
	effects := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" IN (1, 2)`)
	rows := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" IN (1, 2)`)
	if res[1] != nil && res[2] == nil && effects == 0 && rows == 0 {
		t.Fatalf("offset 2 reported done (replay) but no effect/inbox row for message-id m-x exists; offset 1 failed: %v", res[1])
	}
}

// TestInboxDedupAnyBytes: a dedup key is any bytes. Header values that are
// not UTF-8, that hold a NUL, or that are long (6,000 hex characters, past
// what a btree index row can hold) are applied once and deduplicated like
// any other, in both modes, instead of failing every attempt (which under
// runner.Block wedges their key forever).
func TestInboxDedupAnyBytes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789abcdef", 375) // 6,000 characters
	values := map[string][]byte{
		"not utf-8": {0xff, 0xfe, 0x00, 0xc3},
		"nul":       []byte("order\x00-1"),
		"long":      []byte(long),
		"long-2":    []byte(long[:5999] + "x"), // differs in the last byte only
	}
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			pool, s, h := inboxDedupStore(t, batch)
			ctx := context.Background()
			off := int64(0)
			for name, v := range values {
				for _, p := range []int32{0, 0, 1} { // the value, again on the next offset, on another partition
					off++
					r := inboxRec("t", p, off)
					r.Headers = []runner.Header{{Key: "message-id", Value: v}}
					if err := h(ctx, r); err != nil {
						t.Fatalf("%s (%s): %v", name, r.String(), err)
					}
				}
			}
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != int64(len(values)) {
				t.Fatalf("%d effects, want %d (one per value)", n, len(values))
			}
			if st := s.Stats(); st.Replays != int64(2*len(values)) {
				t.Fatalf("%d replays, want %d", st.Replays, 2*len(values))
			}
		})
	}
}

// TestInboxDedupKeysPerTopic: a dedup key is scoped to its topic. The same
// order id on two topics a Store handles (an order and its refund, say) is
// two events: both are applied; on one topic it is a replay.
func TestInboxDedupKeysPerTopic(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	s := inboxStore(t, pool, "g", inbox.DedupHeader("order-id"))
	for _, topic := range []string{"orders", "refunds"} {
		inboxTake(t, s, runner.TP{Topic: topic, Partition: 0}, -1)
	}
	h := s.Handler(inboxEffect("a"))
	for i, r := range []runner.Record{inboxRec("orders", 0, 1), inboxRec("refunds", 0, 1), inboxRec("orders", 0, 2)} {
		r.Headers = []runner.Header{{Key: "order-id", Value: []byte("o-17")}}
		if err := h(ctx, r); err != nil {
			t.Fatalf("record %d (%s): %v", i, r.String(), err)
		}
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 2 {
		t.Fatalf("%d effects, want 2 (the order and the refund; the second order record is a replay)", n)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE topic = 'refunds'"); n != 1 {
		t.Fatalf("the refund with the order's id was not applied (%d effects on refunds)", n)
	}
}
