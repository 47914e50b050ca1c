package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Coordinator is what the inbox asks the consumer group's coordinator:
// which member owns each partition now. The franz and kafkago Sources
// implement it (their PartitionOwners method); give the member's Source
// to its Store with the Owners option. It keeps the inbox free of a Kafka
// client.
type Coordinator interface {
	// PartitionOwners returns, for each of tps, the member id of the
	// member of group that the coordinator's current assignment gives it
	// to; a partition no member has is missing from the map. It returns
	// an error when the coordinator cannot say now (a classic group that
	// is rebalancing has no settled assignment) or cannot be reached. It
	// must be safe for concurrent use; ctx bounds it.
	PartitionOwners(ctx context.Context, group string, tps []runner.TP) (map[runner.TP]string, error)
}

// Owners lets the Store ask the group coordinator, through c, which member
// owns a partition whose lease its handler finds taken by another epoch.
// If the coordinator names this member (the Member of the assignment this
// Store's hook took the lease for), the lease was taken by a bump that
// reached the database late from an assignment that had ended — another
// member's hook retried through a database outage after the group moved
// the partition — and the Store takes the lease back and applies the
// record. If it names another member, or none, the record is fenced
// (FencedError) as without the option. So the member the coordinator says
// owns a partition is never left fenced: its next record retakes the
// lease, within one coordinator request and one statement (more while a
// classic group rebalances: the record is then retried by the runner,
// see ErrOwnerUnknown). Without the option such a partition stays fenced
// until it is next assigned. Default none.
func Owners(c Coordinator) Option {
	return func(cfg *config) {
		if c == nil {
			cfg.errs = append(cfg.errs, &ConfigError{Option: "Owners", Reason: "nil Coordinator"})
		}
		cfg.owners = c
	}
}

// ErrOwnerUnknown is returned, wrapped, by a Store's handler for a record
// whose lease another epoch holds when the group coordinator could not say
// which member owns the partition (a classic group is rebalancing, or the
// coordinator cannot be reached). It wraps runner.ErrOutcomeUnknown: the
// record was not applied, but it may be this member's to apply, so the
// runner retries it — never skips or dead-letters it — until the
// coordinator answers or the partition is revoked.
var ErrOwnerUnknown = fmt.Errorf("inbox: the group coordinator could not say which member owns the partition: %w", runner.ErrOutcomeUnknown)

// lease is what a Store holds of a partition's lease: the epoch its hook
// (or a retake) took, and the member id of the assignment it took it for.
type lease struct {
	epoch  int64
	member string
}

// ownerCheck is one partition's retake in progress, shared by the records
// that meet the same stale bump, so that they ask the coordinator once.
type ownerCheck struct {
	done  chan struct{}
	epoch int64 // the epoch taken back, when won
	won   bool
	err   error
}

// owning is the Store's state for retakes: the checks in progress, and
// the lease epoch at which the coordinator last said this member does not
// own a partition (records that meet that epoch are fenced at once).
type owning struct {
	mu       sync.Mutex
	checks   map[runner.TP]*ownerCheck
	notOwner map[runner.TP]int64
}

// ownerLookupTimeout bounds one PartitionOwners request.
const ownerLookupTimeout = 10 * time.Second

// retake is called when a record of tp found the lease at epoch current
// (0 when not known) instead of held's. It reports whether this member
// owns tp by the coordinator, and then took the lease back at epoch; an
// error is ErrOwnerUnknown (or the database's).
func (s *Store) retake(ctx context.Context, sc *schema, tp runner.TP, held lease, current int64) (epoch int64, won bool, err error) {
	if s.cfg.owners == nil || held.member == "" {
		return 0, false, nil
	}
	if l, _ := s.lease(tp); l.epoch > held.epoch {
		return l.epoch, true, nil // retaken (or reassigned) meanwhile: try that one
	}
	s.owning.mu.Lock()
	if e, ok := s.owning.notOwner[tp]; ok && current != 0 && e == current {
		s.owning.mu.Unlock()
		return 0, false, nil
	}
	c := s.owning.checks[tp]
	leader := c == nil
	if leader {
		c = &ownerCheck{done: make(chan struct{})}
		if s.owning.checks == nil {
			s.owning.checks = map[runner.TP]*ownerCheck{}
		}
		s.owning.checks[tp] = c
	}
	s.owning.mu.Unlock()
	if !leader {
		select {
		case <-c.done:
			return c.epoch, c.won, c.err
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	defer func() {
		c.epoch, c.won, c.err = epoch, won, err
		s.owning.mu.Lock()
		delete(s.owning.checks, tp)
		s.owning.mu.Unlock()
		close(c.done)
	}()
	return s.retakeOnce(ctx, sc, tp, held, current)
}

func (s *Store) retakeOnce(ctx context.Context, sc *schema, tp runner.TP, held lease, current int64) (int64, bool, error) {
	lctx, cancel := context.WithTimeout(ctx, ownerLookupTimeout)
	owners, err := s.cfg.owners.PartitionOwners(lctx, s.group, []runner.TP{tp})
	cancel()
	if err != nil {
		s.log.Warn("inbox: the partition's lease is at another epoch and the group coordinator could not say who owns it; the runner retries",
			"partition", tp.String(), "epoch", held.epoch, "lease_epoch", current, "err", err)
		return 0, false, fmt.Errorf("%w (%s): %w", ErrOwnerUnknown, tp, err)
	}
	if owner, ok := owners[tp]; !ok || owner != held.member {
		s.owning.mu.Lock()
		if s.owning.notOwner == nil {
			s.owning.notOwner = map[runner.TP]int64{}
		}
		s.owning.notOwner[tp] = current
		s.owning.mu.Unlock()
		return 0, false, nil
	}
	// The coordinator says this member owns tp: take the lease back, unless
	// it moved again since the record saw it (then the record runs again
	// and meets that epoch).
	var epoch int64
	err = s.pool.QueryRow(ctx, sc.sql.retake, s.group, tp.Topic, tp.Partition, current, s.cfg.owner, held.member).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, connError("taking back the lease of "+tp.String(), err)
	}
	s.setLeaseIfNewer(tp, lease{epoch: epoch, member: held.member})
	s.countRetaken(ctx, tp.Topic)
	s.log.Warn("inbox: took back the lease of a partition the group coordinator says this member owns; a late bump from an ended assignment had taken it",
		"partition", tp.String(), "member", held.member, "from_epoch", current, "epoch", epoch)
	return epoch, true, nil
}

// Lease is one partition's lease as the database holds it, for people (see
// Leases).
type Lease struct {
	Topic     string
	Partition int32
	// Epoch is bumped by every assignment, retake and reset.
	Epoch int64
	// Owner is the Owner of the Store that took it; Member the Kafka
	// member id of the assignment it took it for ("" when unknown).
	Owner, Member string
	Acquired      time.Time
	// AppliedBelow is the partition's applied low-water mark: every offset
	// below it was consumed by the group (see Store.Prune).
	AppliedBelow int64
}

// Leases returns the leases of group in the database pool reaches (the
// Schema option's schema, else the search_path's), ordered by topic and
// partition; with topic not empty, only that topic's. Only the Schema
// option matters here.
func Leases(ctx context.Context, pool *pgxpool.Pool, group, topic string, opts ...Option) ([]Lease, error) {
	n, err := namesOf(pool, opts)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT topic, partition, epoch, owner, coalesce(member, ''), acquired_at, applied_below
FROM `+n.lease+` WHERE group_id = $1 AND ($2 = '' OR topic = $2) ORDER BY topic, partition`, group, topic)
	if err != nil {
		return nil, leasesError(ctx, pool, n, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Lease, error) {
		var l Lease
		err := row.Scan(&l.Topic, &l.Partition, &l.Epoch, &l.Owner, &l.Member, &l.Acquired, &l.AppliedBelow)
		return l, err
	})
	if err != nil {
		return nil, leasesError(ctx, pool, n, err)
	}
	return out, nil
}

// ResetLeases bumps the epoch of every lease of group (with topic not
// empty, of that topic), so that no member holds one: each running
// member's next commit on those partitions is fenced. A member with the
// Owners option takes back, on its next record, the lease of a partition
// the group coordinator says it owns; others take their leases at their
// next assignment — until then their records of those partitions are
// fenced. Use it to stop members you cannot stop from committing (a
// zombie process), not for routine operation. The applied marks stay. It
// returns how many leases it reset. Only the Schema option matters here.
func ResetLeases(ctx context.Context, pool *pgxpool.Pool, group, topic string, opts ...Option) (int64, error) {
	n, err := namesOf(pool, opts)
	if err != nil {
		return 0, err
	}
	tag, err := pool.Exec(ctx, `UPDATE `+n.lease+` SET epoch = epoch + 1, owner = 'reset by tidemark inbox leases', member = NULL, acquired_at = now()
WHERE group_id = $1 AND ($2 = '' OR topic = $2)`, group, topic)
	if err != nil {
		return 0, leasesError(ctx, pool, n, err)
	}
	return tag.RowsAffected(), nil
}

func namesOf(pool *pgxpool.Pool, opts []Option) (names, error) {
	if pool == nil {
		return names{}, &ConfigError{Option: "pool", Reason: "nil pool"}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return names{}, err
	}
	return newNames(cfg.schema), nil
}

func leasesError(ctx context.Context, pool *pgxpool.Pool, n names, err error) error {
	if isCode(err, "42P01") || isCode(err, "42703") {
		if v, verr := version(ctx, pool, n); verr == nil && v < SchemaVersion {
			return fmt.Errorf("inbox: leases: %w", notMigrated(n, v))
		}
	}
	return connError("leases", err)
}
