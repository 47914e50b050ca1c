package inbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// AssignHook returns the hook to pass to runner.OnAssign. For each assigned
// partition, before any of its records runs, it
//
//  1. takes the partition's lease: one UPSERT bumps the lease epoch and
//     names this Store's owner. The bump waits for old owners' transactions
//     that are committing; from then on every old-owner transaction fails
//     its fence at commit (FencedError), whether it started before the bump
//     or after;
//  2. remembers the new epoch, which this Store's handlers check;
//  3. loads the partition's applied offsets (up to ReplayLimit; see there)
//     and returns them as the runner's Applied filter, so records applied
//     before — by this member before a restart, or by the previous owner —
//     complete without a transaction.
//
// A failing hook returns the error and the runner retries it with backoff;
// a missing schema is reported as ErrNotMigrated. Nothing needs releasing
// on revoke: the next owner's bump fences this member, and a Store that
// gets the partition back bumps again.
func (s *Store) AssignHook() runner.AssignHook {
	return func(ctx context.Context, as []runner.Assignment) ([]runner.Applied, error) {
		sc, err := s.resolve(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]runner.Applied, len(as))
		for i, a := range as {
			f, err := s.take(ctx, sc, a)
			if err != nil {
				return nil, err
			}
			out[i] = f
		}
		return out, nil
	}
}

// take takes one partition's lease and loads its applied offsets.
func (s *Store) take(ctx context.Context, sc *schema, a runner.Assignment) (runner.Applied, error) {
	start := time.Now()
	var epoch, below int64
	err := s.pool.QueryRow(ctx, sc.sql.bump, s.group, a.TP.Topic, a.TP.Partition, s.cfg.owner).Scan(&epoch, &below)
	if err != nil {
		return nil, s.hookError(ctx, sc, a.TP, "taking the lease", err)
	}
	s.setEpoch(a.TP, epoch)
	set, loaded, err := s.loadApplied(ctx, sc, a)
	if err != nil {
		return nil, s.hookError(ctx, sc, a.TP, "loading applied offsets", err)
	}
	s.countLease(ctx, loaded)
	s.log.Info("partition lease taken", "partition", a.TP.String(), "epoch", epoch, "start", a.Start,
		"applied_loaded", loaded, "applied_runs", set.runs(), "applied_below", below, "took", time.Since(start))
	return s.filter(a.TP, set, loaded, below), nil
}

// filter is the runner's Applied filter of one assignment: the loaded
// applied offsets, and every offset below the partition's applied mark
// (retention pruned their rows). The first record below the mark is
// logged: it means the group went back before what retention kept — its
// committed offsets were deleted or expired, or reset — and its records
// below the mark are skipped as replays, not applied again.
func (s *Store) filter(tp runner.TP, set *offsetSet, loaded int, below int64) runner.Applied {
	if below <= 0 {
		if loaded == 0 {
			return nil
		}
		return set.contains
	}
	var once sync.Once
	return func(off int64) bool {
		if off >= below {
			return set.contains(off)
		}
		once.Do(func() {
			s.log.Warn("records below the partition's applied mark are skipped as replays: retention pruned their inbox rows after the group consumed them; the group's committed offsets were deleted, expired or reset",
				"partition", tp.String(), "first", off, "applied_below", below)
		})
		return true
	}
}

func (s *Store) hookError(ctx context.Context, sc *schema, tp runner.TP, what string, err error) error {
	if isCode(err, "42P01") || isCode(err, "42703") { // undefined_table, undefined_column
		v, verr := version(ctx, s.pool, sc.n)
		if verr == nil && v < SchemaVersion {
			return fmt.Errorf("inbox: %s of %s: %w", what, tp, notMigrated(sc.n, v))
		}
	}
	return connError(what+" of "+tp.String(), err)
}

// loadApplied reads the partition's inbox offsets that a replay may meet:
// those at or above the start offset when it is known, the newest ones
// otherwise (franz-go learns the committed offset only from its first
// fetch, after the assignment).
func (s *Store) loadApplied(ctx context.Context, sc *schema, a runner.Assignment) (*offsetSet, int, error) {
	if s.cfg.replayLimit == 0 {
		return &offsetSet{}, 0, nil
	}
	var rows pgx.Rows
	var err error
	newest := a.Start < 0 // watermark.Unknown
	if !newest {
		rows, err = s.pool.Query(ctx, sc.sql.appliedFrom, s.group, a.TP.Topic, a.TP.Partition, a.Start, s.cfg.replayLimit)
	} else {
		rows, err = s.pool.Query(ctx, sc.sql.appliedNewest, s.group, a.TP.Topic, a.TP.Partition, s.cfg.replayLimit)
	}
	if err != nil {
		return nil, 0, err
	}
	offs := make([]int64, 0, 1024)
	var off int64
	_, err = pgx.ForEachRow(rows, []any{&off}, func() error {
		offs = append(offs, off)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	if newest {
		slices.Reverse(offs)
	}
	return newOffsetSet(offs), len(offs), nil
}
