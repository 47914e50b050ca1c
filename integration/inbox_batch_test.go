//go:build integration

package integration_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestInboxBatchEffectSQLError: in a batch, an Effect whose statement
// PostgreSQL refuses (the transaction is then aborted until the rollback
// to the record's savepoint) fails alone: the other records of its batch
// commit. Before, the rollback went out in a pgx batch whose statements pgx
// had to prepare first, which an aborted transaction refuses ("current
// transaction is aborted"), and every record of the batch failed with it,
// again on every retry.
func TestInboxBatchEffectSQLError(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g", inbox.Batch(8), inbox.BatchWait(1e9))
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		if rec.Offset == 3 {
			_, err := tx.Exec(ctx, "SELECT 1/$1::int", 0)
			return err
		}
		return nil
	})
	var recs []runner.Record
	for off := range int64(8) {
		recs = append(recs, inboxRec("t", 0, off))
	}
	for i, err := range inboxApplyAll(h, recs) {
		if (i == 3) != (err != nil) {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 7 {
		t.Fatalf("%d effects, want 7", n)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" = 3`); n != 0 {
		t.Fatalf("the failed record's inbox row is still there")
	}
}
