package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// ShareGroup makes the Store serve a share group (KIP-932,
// pkg/source/share) instead of a consumer group: group is then the share
// group's name. A share group has no partition owner, so there is no lease
// to take and nothing to fence by epoch: every member applies records of
// every partition at once. What makes a redelivered record — a lock that
// expired, a member killed or stopped, an ack lost — a replay is the
// record's inbox row, whose primary key (group, topic, partition, offset)
// is inserted in the effect's transaction: whichever member commits first
// applies the effect, and every other delivery of the record, before or
// after, finds the row (or waits for the transaction holding it) and does
// nothing.
//
// Per partition, on its first record, the Store creates the partition's
// lease row once for the whole group (epoch 1, no member) and never bumps
// it: the row holds the applied mark that retention raises (see Prune),
// and the commit-time fence checks the epoch as everywhere. An epoch
// changed by hand (`tidemark inbox leases --reset`) fences the
// transactions open at that moment; the Store then reads the new epoch and
// runs the record again.
//
// With ShareGroup, AssignHook returns a hook that fails (the runner also
// refuses OnAssign over a share source), Owners is refused, and the
// handler refuses a record that does not come from a share group (its
// DeliveryCount is 0): over a consumer group the lease is what stops an old
// owner, and a Store without it would apply an old owner's records.
// Retention has no committed offset to follow: pass RunRetention the
// share-partition start offsets (docs/inbox.md).
func ShareGroup() Option { return func(c *config) { c.share = true } }

// shareOwner is what a share-group lease row's owner column says.
const shareOwner = "share group"

// errShareHook is what a ShareGroup Store's assign hook returns.
var errShareHook = errors.New("inbox: a ShareGroup Store takes no leases: a share group has no partition owner; do not pass runner.OnAssign(store.AssignHook()) (the runner refuses OnAssign over a share source)")

// ErrNotShared is returned, wrapped with the record, by a ShareGroup
// Store's handler for a record that did not come from a share group (its
// DeliveryCount is 0): a consumer group needs the lease a ShareGroup Store
// does not take.
var ErrNotShared = errors.New("inbox: the Store was made with ShareGroup but the record does not come from a share group (delivery count 0); over a consumer group make the Store without ShareGroup and pass runner.OnAssign(store.AssignHook())")

// shareLease returns the epoch of tp's share-group lease row, creating
// the row if the partition has none, and remembers it. Two members
// creating it at once: the second one's insert waits for the first, does
// nothing and, in the same statement, cannot see the row (its snapshot is
// older), so it asks again.
func (s *Store) shareLease(ctx context.Context, sc *schema, tp runner.TP) (lease, error) {
	for range 3 {
		var epoch int64
		err := s.pool.QueryRow(ctx, sc.sql.shareLease, s.group, tp.Topic, tp.Partition, shareOwner).Scan(&epoch)
		if err == nil {
			l := lease{epoch: epoch}
			s.setShareLease(tp, l)
			return l, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return lease{}, connError(fmt.Sprintf("reading the share-group lease row of %s", tp), err)
		}
	}
	return lease{}, fmt.Errorf("inbox: the share-group lease row of %s was neither created nor found", tp)
}

// setShareLease records a share-group lease's epoch, whatever the one
// before: the epoch only changes by hand, and the database's is right.
func (s *Store) setShareLease(tp runner.TP, l lease) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	old := *s.leases.Load()
	m := make(map[runner.TP]lease, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[tp] = l
	s.leases.Store(&m)
}

// reread is retake for a ShareGroup Store: the lease's epoch was changed
// by hand while a record's transaction ran; read the new one and run the
// record again (won), unless it is the one that fenced it.
func (s *Store) reread(ctx context.Context, sc *schema, tp runner.TP, held lease, _ int64) (int64, bool, error) {
	l, err := s.shareLease(ctx, sc, tp)
	if err != nil {
		return 0, false, err
	}
	return l.epoch, l.epoch != held.epoch, nil
}
