package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// CommittedFunc returns the consumer group's committed offsets (the next
// offset to consume) for tps. A partition missing from the map, or with a
// negative offset, is not pruned. It is how retention learns the Kafka side
// without the inbox depending on a Kafka client; with franz-go it is a
// kadm.Client.FetchOffsets call (docs/inbox.md has one).
type CommittedFunc func(ctx context.Context, tps []runner.TP) (map[runner.TP]int64, error)

// Prune deletes tp's inbox rows that no replay can need any more, and
// remembers that it did: it raises the partition's applied low-water mark
// in the same transaction as each DELETE, and a record below the mark is a
// replay whether or not its row is still there (its effect is not run; the
// runner counts it as replay-skipped, or the inbox as a replay). So
// records are never applied twice because their rows were pruned — also
// when the group's committed offsets are deleted or expire
// (offsets.retention.minutes) and the group starts again from the earliest
// offset.
//
// Rows without a dedup key go from the mark up to below
// committed-RetainRecords. With RetainFor(d), the mark stops at the first
// row younger than d, and rises only to a committed offset that Prune (or
// a retention round) was given at least d ago, less RetainRecords: a dead
// letter has no row to stop it, and it stays above the mark — redrivable
// (see OriginBelowMarkError) — for d after the group's committed offset
// passed it. So the first rounds with RetainFor raise no mark for d. Rows
// with a dedup key stay until they are older than
// DedupWindow (they catch the same key at other offsets), then go too.
// committed is the group's committed offset for tp, as the broker
// acknowledged it; pass nothing larger: every offset below the mark must
// have been consumed. A partition without a lease (no member ever took it)
// is not pruned. Rows go in DELETEs of at most PruneBatch rows, each its
// own short transaction, so Prune never holds many locks and can be
// stopped between batches through ctx; each reads only the rows it deletes
// and those it passes, so a round with nothing to delete costs nothing. It
// returns how many rows it deleted, also when it fails part way.
//
// Prune is for code that runs retention itself; RunRetention is the loop
// most services want.
func (s *Store) Prune(ctx context.Context, tp runner.TP, committed int64) (int64, error) {
	sc, err := s.resolve(ctx)
	if err != nil {
		return 0, err
	}
	return s.prune(ctx, sc, tp, committed)
}

func (s *Store) prune(ctx context.Context, sc *schema, tp runner.TP, committed int64) (int64, error) {
	bound := committed - s.cfg.retainRecords
	if committed < 0 || bound <= 0 {
		return 0, nil
	}
	if d := s.cfg.retainFor; d > 0 {
		// The mark rises only to a bound seen at least d ago (see
		// pruneBound): a dead letter has no row to keep, and a bound
		// younger than d may have passed it less than d ago.
		var leased bool
		var ripe *int64
		err := s.pool.QueryRow(ctx, sc.sql.pruneBound, s.group, tp.Topic, tp.Partition, committed,
			d.Microseconds(), (d/boundSpacing).Microseconds()).Scan(&leased, &ripe)
		if err != nil {
			if isCode(err, "42P01") { // undefined_table
				if v, verr := version(ctx, s.pool, sc.n); verr == nil && v < SchemaVersion {
					return 0, fmt.Errorf("inbox: pruning %s: %w", tp, notMigrated(sc.n, v))
				}
			}
			return 0, connError("pruning "+tp.String(), err)
		}
		if !leased {
			return 0, nil
		}
		if ripe == nil {
			bound = 0
		} else {
			bound = min(bound, *ripe-s.cfg.retainRecords)
		}
	}
	var total int64
	defer func() { s.countPruned(ctx, tp.Topic, total) }()
	for bound > 0 {
		var deleted, scanned, mark int64
		err := s.pool.QueryRow(ctx, sc.sql.prune, s.group, tp.Topic, tp.Partition, bound,
			s.cfg.retainFor.Microseconds(), s.cfg.pruneBatch).Scan(&deleted, &scanned, &mark)
		if errors.Is(err, pgx.ErrNoRows) {
			return total, nil // no lease
		}
		if err != nil {
			return total, connError("pruning "+tp.String(), err)
		}
		total += deleted
		// Done when the scan reached the bound, or stopped at a row
		// RetainFor keeps.
		if scanned < int64(s.cfg.pruneBatch) || deleted < scanned {
			break
		}
	}
	for {
		tag, err := s.pool.Exec(ctx, sc.sql.pruneKeys, s.group, tp.Topic, tp.Partition,
			s.cfg.dedupWindow.Microseconds(), s.cfg.pruneBatch)
		if err != nil {
			return total, connError("pruning expired dedup keys of "+tp.String(), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.cfg.pruneBatch) {
			return total, nil
		}
	}
}

// boundSpacing is how many bounds per RetainFor a partition remembers at
// most: a round remembers its bound only when the newest remembered one is
// older than RetainFor/boundSpacing, so the mark lags RetainFor by at most
// that much more, and the table holds a few rows per partition whatever
// the rounds' interval.
const boundSpacing = 16

// RunRetention prunes, every interval, each partition that has a lease in
// the group, below the offsets committed returns (see Prune). It blocks
// until ctx is done and then returns ctx.Err(). Start it on one goroutine
// of your own, beside the runner; every replica may run it: the group runs
// one round per interval, on the replica that takes the group's retention
// lease (a row in tidemark_inbox_retention, not a session lock, so it works
// through a pooler in transaction mode such as PgBouncer), and the others
// skip. The lease lasts the round and then until interval after the
// round's start; a replica that dies in a round holds it for at most two
// minutes after its last partition. A failed round is logged and the next
// one tries again.
func (s *Store) RunRetention(ctx context.Context, interval time.Duration, committed CommittedFunc) error {
	if interval <= 0 {
		return &ConfigError{Option: "RunRetention", Reason: fmt.Sprintf("interval %v is not positive", interval)}
	}
	if committed == nil {
		return &ConfigError{Option: "RunRetention", Reason: "nil CommittedFunc"}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n, ran, err := s.retentionRound(ctx, committed, interval); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Warn("inbox retention round failed; retrying at the next one", "err", err, "pruned", n)
		} else if ran {
			s.log.Debug("inbox retention round", "pruned", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RetentionRound runs one retention round now — Prune for every partition
// with a lease in the group, below the offsets committed returns — unless
// another Store of the group holds the group's retention lease (its round
// runs, or its RunRetention ran one less than an interval ago); ran reports
// which. It is RunRetention's round, for code that schedules retention
// itself (a cron job); it releases the lease when it returns.
func (s *Store) RetentionRound(ctx context.Context, committed CommittedFunc) (pruned int64, ran bool, err error) {
	if committed == nil {
		return 0, false, &ConfigError{Option: "RetentionRound", Reason: "nil CommittedFunc"}
	}
	return s.retentionRound(ctx, committed, 0)
}

// retentionTTL is how long the retention lease lasts without a renewal; a
// round renews it before each partition.
const retentionTTL = 2 * time.Minute

// retentionRound prunes every leased partition of the group if it takes
// the group's retention lease, which it keeps until hold after the round's
// start; ran is false when another Store held it.
func (s *Store) retentionRound(ctx context.Context, committed CommittedFunc, hold time.Duration) (pruned int64, ran bool, err error) {
	sc, err := s.resolve(ctx)
	if err != nil {
		return 0, false, err
	}
	ttl := retentionTTL.Microseconds()
	var started time.Time
	err = s.pool.QueryRow(ctx, sc.sql.retentionClaim, s.group, s.holder, ttl).Scan(&started)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, connError("retention lease", err)
	}
	defer func() {
		// Released on another context: a round stopped by ctx still lets
		// the next one run on time. If this fails the lease expires.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = s.pool.Exec(rctx, sc.sql.retentionRelease, s.group, s.holder, started.Add(hold))
	}()

	rows, err := s.pool.Query(ctx, sc.sql.partitions, s.group)
	if err != nil {
		return 0, true, connError("retention: listing partitions", err)
	}
	var tps []runner.TP
	var tp runner.TP
	if _, err := pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition}, func() error {
		tps = append(tps, tp)
		return nil
	}); err != nil {
		return 0, true, connError("retention: listing partitions", err)
	}
	if len(tps) == 0 {
		return 0, true, nil
	}
	offsets, err := committed(ctx, tps)
	if err != nil {
		return 0, true, fmt.Errorf("inbox: retention: committed offsets: %w", err)
	}
	for _, tp := range tps {
		off, ok := offsets[tp]
		if !ok || off < 0 {
			continue
		}
		tag, err := s.pool.Exec(ctx, sc.sql.retentionRenew, s.group, s.holder, ttl)
		if err != nil {
			return pruned, true, connError("retention lease", err)
		}
		if tag.RowsAffected() == 0 {
			return pruned, true, errors.New("inbox: retention: the round outlived its lease and another Store took it; stopping this round")
		}
		n, err := s.prune(ctx, sc, tp, off)
		pruned += n
		if err != nil {
			return pruned, true, err
		}
	}
	return pruned, true, nil
}
