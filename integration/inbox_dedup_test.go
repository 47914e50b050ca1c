//go:build integration

package integration_test

import (
	"context"
	"errors"
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
