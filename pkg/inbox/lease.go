package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// AssignHook returns the hook to pass to runner.OnAssign. For the
// partitions of an assignment report, before any of their records runs, it
//
//  1. takes their leases: one statement bumps each partition's lease epoch
//     and names this Store's owner. The bump waits for old owners'
//     transactions that are committing; from then on every old-owner
//     transaction fails its fence at commit (FencedError), whether it
//     started before the bump or after;
//  2. remembers the new epochs, which this Store's handlers check;
//  3. loads each partition's applied offsets (up to ReplayLimit; see
//     there) and returns them, with everything below the partition's
//     applied mark (see Prune), as the runner's Applied filters, so records
//     applied before — by this member before a restart, or by the previous
//     owner — complete without a transaction.
//
// The two statements go in one round trip, whatever the number of
// partitions. A failing hook returns the error and the runner retries it
// with backoff; a missing schema is reported as ErrNotMigrated. Nothing
// needs releasing on revoke: the next owner's bump fences this member, and
// a Store that gets the partition back bumps again.
//
// A ShareGroup Store takes no leases: its hook fails every call.
func (s *Store) AssignHook() runner.AssignHook {
	return func(ctx context.Context, as []runner.Assignment) ([]runner.Applied, error) {
		if s.cfg.share {
			return nil, errShareHook
		}
		if len(as) == 0 {
			return nil, nil
		}
		sc, err := s.resolve(ctx)
		if err != nil {
			return nil, err
		}
		return s.take(ctx, sc, as)
	}
}

// taken is what the assign hook learned of one partition.
type taken struct {
	epoch, below int64
	offs         []int64
}

// take takes the leases of one assignment report and loads their applied
// offsets, in one round trip.
func (s *Store) take(ctx context.Context, sc *schema, as []runner.Assignment) ([]runner.Applied, error) {
	start := time.Now()
	// The bump locks the lease rows in the order given: sorted, so that two
	// members taking overlapping partitions at once cannot deadlock. A
	// partition reported twice is taken once.
	tps := make([]runner.TP, 0, len(as))
	byTP := map[runner.TP]runner.Assignment{}
	for _, a := range as {
		if _, dup := byTP[a.TP]; !dup {
			tps = append(tps, a.TP)
		}
		byTP[a.TP] = a
	}
	slices.SortFunc(tps, func(a, b runner.TP) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	froms := make([]int64, len(tps))
	members := make([]*string, len(tps))
	for i, tp := range tps {
		a := byTP[tp]
		topics[i], parts[i], froms[i] = tp.Topic, tp.Partition, a.Start
		if a.Member != "" {
			members[i] = &a.Member
		}
	}

	b := &pgx.Batch{}
	b.Queue(sc.sql.bump, s.group, s.cfg.owner, topics, parts, members)
	if s.cfg.replayLimit > 0 {
		b.Queue(sc.sql.applied, s.group, topics, parts, froms, s.cfg.replayLimit)
	}
	got := make(map[runner.TP]*taken, len(tps))
	br := s.pool.SendBatch(ctx, b)
	err := func() error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var tp runner.TP
		var epoch, below int64
		if _, err := pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &epoch, &below}, func() error {
			got[tp] = &taken{epoch: epoch, below: below}
			return nil
		}); err != nil {
			return err
		}
		if s.cfg.replayLimit == 0 {
			return nil
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		var i int32
		var off int64
		_, err = pgx.ForEachRow(rows, []any{&i, &off}, func() error {
			if t := got[tps[i-1]]; t != nil {
				t.offs = append(t.offs, off)
			}
			return nil
		})
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, s.hookError(ctx, sc, tps, err)
	}
	leases := make(map[runner.TP]lease, len(tps))
	for _, tp := range tps {
		t := got[tp]
		if t == nil {
			return nil, fmt.Errorf("inbox: taking the lease of %s: the database returned no lease", tp)
		}
		leases[tp] = lease{epoch: t.epoch, member: byTP[tp].Member}
	}
	s.setLeases(leases)
	out := make([]runner.Applied, len(as))
	for i, a := range as {
		t := got[a.TP]
		set := newOffsetSet(t.offs)
		s.countLease(ctx, a.TP.Topic, len(t.offs))
		s.log.Info("partition lease taken", "partition", a.TP.String(), "epoch", t.epoch, "start", a.Start,
			"applied_loaded", len(t.offs), "applied_runs", set.runs(), "applied_below", t.below, "took", time.Since(start))
		out[i] = s.filter(a.TP, set, len(t.offs), t.below)
	}
	return out, nil
}

func (s *Store) hookError(ctx context.Context, sc *schema, tps []runner.TP, err error) error {
	what := fmt.Sprintf("taking the leases of %s", tps[0])
	if len(tps) > 1 {
		what += fmt.Sprintf(" and %d more partitions", len(tps)-1)
	}
	if isCode(err, "42P01") || isCode(err, "42703") { // undefined_table, undefined_column
		v, verr := version(ctx, s.pool, sc.n)
		if verr == nil && v < SchemaVersion {
			return fmt.Errorf("inbox: %s: %w", what, notMigrated(sc.n, v))
		}
	}
	return connError(what, err)
}

// filter is the runner's Applied filter of one assignment: the loaded
// applied offsets, and every offset below the partition's applied mark
// (retention pruned their rows). The first record below the mark is
// logged: it means the group went back before what retention kept — its
// committed offsets were deleted or expired, or reset — and its records
// below the mark are skipped as replays, not applied again.
func (s *Store) filter(tp runner.TP, set *offsetSet, loaded int, below int64) runner.Applied {
	if !s.replayProtected() {
		return nil // UnsafeNoReplayProtection: nothing is skipped
	}
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
