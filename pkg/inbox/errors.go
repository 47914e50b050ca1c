package inbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/pkg/runner"
)

// FencedError is returned by a Store's handler when the partition's lease
// moved to a newer epoch — another member, or a later assignment of this
// one, took the partition — before the record's transaction committed. The
// transaction was rolled back: neither the effect nor the inbox row exists.
// It unwraps to runner.ErrFenced, so the runner neither completes nor
// retries the record; its new owner handles it.
type FencedError struct {
	Record string // topic/partition@offset, or the partition for a batch
	// Epoch is the lease epoch this member held; Current the lease's epoch
	// as the database saw it (0 when the partition has no lease).
	Epoch, Current int64
	// Cause is the database error when the fence trigger refused the
	// commit, nil when the claim saw the newer epoch first.
	Cause error
}

func (e *FencedError) Error() string {
	msg := fmt.Sprintf("inbox: %s fenced: this member holds lease epoch %d", e.Record, e.Epoch)
	if e.Current != 0 {
		msg += fmt.Sprintf(", the partition's lease is at epoch %d", e.Current)
	} else if e.Cause == nil {
		msg += ", the partition has no lease"
	} else {
		msg += ", the lease moved on before the commit"
	}
	return msg
}

// Unwrap returns runner.ErrFenced and the database error, if any.
func (e *FencedError) Unwrap() []error {
	if e.Cause != nil {
		return []error{runner.ErrFenced, e.Cause}
	}
	return []error{runner.ErrFenced}
}

// ErrNoLease is returned, wrapped with the record, by a Store's handler for
// a partition its assign hook never leased: the runner was built without
// runner.OnAssign(store.AssignHook()), or with the hook of another Store.
// The runner's failure policy handles it like any error.
var ErrNoLease = errors.New("inbox: no lease for the partition; pass runner.OnAssign(store.AssignHook()) to runner.New")

// fencedByTrigger reports whether err is the fence trigger's refusal.
func fencedByTrigger(err error) bool { return isCode(err, fencedCode) }

// retryable reports whether err is a serialization failure or a deadlock —
// PostgreSQL rolled the transaction back and running it again may succeed
// — or a batch's commit refused for a record below the applied mark, which
// the batch run again takes for a replay.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == "40001" || pe.Code == "40P01" || pe.Code == belowMarkCode
}
