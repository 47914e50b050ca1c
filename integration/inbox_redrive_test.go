//go:build integration

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// The inbox's recognition of redriven dead letters (pkg/inbox/origin.go),
// straight against PostgreSQL: records built with the runner's origin
// headers stand for what `tidemark dlt replay` republishes.

// inboxRedriven is a record at t/partition@offset that is a dead letter of
// origin, as `tidemark dlt replay` republishes it.
func inboxRedriven(partition int32, offset int64, origin runner.Record) runner.Record {
	r := inboxRec("t", partition, offset)
	r.Key, r.Value = origin.Key, origin.Value
	r.Headers = []runner.Header{
		{Key: runner.HeaderOriginTopic, Value: []byte(origin.Topic)},
		{Key: runner.HeaderOriginPartition, Value: []byte(strconv.Itoa(int(origin.Partition)))},
		{Key: runner.HeaderOriginOffset, Value: []byte(strconv.FormatInt(origin.Offset, 10))},
	}
	return r
}

// inboxModes are the Store's handler shapes, each as a function that
// applies records one call per record (Handler, QueuedHandler) or in one
// call (BatchHandler), returning each record's error.
type inboxMode struct {
	name  string
	batch int
	apply func(s *inbox.Store) func(ctx context.Context, recs ...runner.Record) []error
}

var inboxModes = []inboxMode{
	{"Handler", 1, perRecord(func(s *inbox.Store) runner.Handler { return s.Handler(inboxEffect("a")) })},
	{"Handler batch 8", 8, perRecord(func(s *inbox.Store) runner.Handler { return s.Handler(inboxEffect("a")) })},
	{"QueuedHandler", 1, perRecord(func(s *inbox.Store) runner.Handler { return s.QueuedHandler(inboxQueuedEffect("a")) })},
	{"QueuedHandler batch 8", 8, perRecord(func(s *inbox.Store) runner.Handler { return s.QueuedHandler(inboxQueuedEffect("a")) })},
	{"BatchHandler", 1, func(s *inbox.Store) func(ctx context.Context, recs ...runner.Record) []error {
		h := s.BatchHandler(inboxBatchEffect("a", nil))
		// One call per partition, as the runner's batches are; the
		// partitions' calls at once.
		return func(ctx context.Context, recs ...runner.Record) []error {
			byTP := map[runner.TP][]int{}
			for i, r := range recs {
				byTP[r.TP()] = append(byTP[r.TP()], i)
			}
			errs := make([]error, len(recs))
			var wg sync.WaitGroup
			for _, idx := range byTP {
				wg.Go(func() {
					batch := make([]runner.Record, len(idx))
					for j, i := range idx {
						batch[j] = recs[i]
					}
					err := h(ctx, batch)
					for _, i := range idx {
						errs[i] = err
					}
				})
			}
			wg.Wait()
			return errs
		}
	}},
}

// perRecord applies records one handler call each, concurrently (so that
// with Batch they share transactions).
func perRecord(mk func(s *inbox.Store) runner.Handler) func(s *inbox.Store) func(ctx context.Context, recs ...runner.Record) []error {
	return func(s *inbox.Store) func(ctx context.Context, recs ...runner.Record) []error {
		h := mk(s)
		return func(ctx context.Context, recs ...runner.Record) []error {
			errs := make([]error, len(recs))
			var wg sync.WaitGroup
			for i, r := range recs {
				wg.Go(func() { errs[i] = h(ctx, r) })
			}
			wg.Wait()
			return errs
		}
	}
}

// inboxBatchEffect is inboxEffect for a BatchEffect; seen, if not nil,
// gets each call's records.
func inboxBatchEffect(owner string, seen func([]runner.Record)) inbox.BatchEffect {
	return func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
		if seen != nil {
			seen(recs)
		}
		for _, rec := range recs {
			if err := inboxEffect(owner)(ctx, tx, rec); err != nil {
				return err
			}
		}
		return nil
	}
}

func noErrors(t *testing.T, what string, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s, record %d: %v", what, i, err)
		}
	}
}

// inboxEffectsOf counts the effects whose value is the origin's.
func inboxEffectsOf(t *testing.T, pool *pgxpool.Pool, origin runner.Record) int64 {
	t.Helper()
	return inboxCount(t, pool, "SELECT count(*) FROM effects WHERE value = $1", string(origin.Value))
}

// TestInboxRedriveRecognisesTheOrigin, in every handler shape:
//   - a redrive of a record that had been applied (its dead-lettering came
//     after the commit: an ambiguous commit) runs no second effect;
//   - a redrive of a record never applied runs its effect once, and a
//     second redrive of it — on another partition, in flight at the same
//     time as a third — runs none;
//   - the origin record itself consumed again (an offset reset) is a
//     replay of its redrive;
//   - malformed origin headers are a permanent error.
func TestInboxRedriveRecognisesTheOrigin(t *testing.T) {
	t.Parallel()
	for _, m := range inboxModes {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.Batch(m.batch))
			for p := range int32(3) {
				inboxTake(t, s, runner.TP{Topic: "t", Partition: p}, -1)
			}
			apply := m.apply(s)

			applied := inboxRec("t", 0, 5) // applied, then dead-lettered anyway
			noErrors(t, "the origin", apply(ctx, applied))
			noErrors(t, "its redrive", apply(ctx, inboxRedriven(1, 20, applied)))
			if n := inboxEffectsOf(t, pool, applied); n != 1 {
				t.Fatalf("%d effects of an applied record after its redrive, want 1", n)
			}

			failed := inboxRec("t", 0, 6) // dead-lettered, never applied
			noErrors(t, "first redrive", apply(ctx, inboxRedriven(1, 21, failed)))
			if n := inboxEffectsOf(t, pool, failed); n != 1 {
				t.Fatalf("%d effects after the first redrive, want 1", n)
			}
			noErrors(t, "second and third redrives", apply(ctx, inboxRedriven(1, 22, failed), inboxRedriven(2, 40, failed)))
			noErrors(t, "the origin consumed again", apply(ctx, failed))
			if n := inboxEffectsOf(t, pool, failed); n != 1 {
				t.Fatalf("%d effects after three redrives and the origin, want 1", n)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE topic = 't' AND partition = 0 AND "offset" = 6 AND via_partition = 1 AND via_offset = 21`); n != 1 {
				t.Fatalf("%d origin rows for t/0@6 naming t/1@21, want 1", n)
			}
			if st := s.Stats(); st.Applied != 2 {
				t.Fatalf("stats %+v, want 2 applied", st)
			}

			bad := inboxRedriven(1, 30, failed)
			bad.Headers[2].Value = []byte("six")
			err := apply(ctx, bad)[0]
			if !errors.Is(err, inbox.ErrBadOrigin) || runner.KindOf(err) != runner.PermanentKind {
				t.Fatalf("malformed origin offset: %v (kind %v), want ErrBadOrigin, permanent", err, runner.KindOf(err))
			}
		})
	}
}

// TestInboxRedriveBelowTheMark: once retention pruned the origin
// partition's rows and raised its applied mark past the origin, a redrive
// cannot be decided: it is refused with *OriginBelowMarkError, a permanent
// error, and writes nothing — no effect, no row for the redriven record —
// whether the origin had been applied or not. An origin above the mark is
// still decided.
func TestInboxRedriveBelowTheMark(t *testing.T) {
	t.Parallel()
	for _, m := range inboxModes {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.Batch(m.batch), inbox.RetainRecords(0))
			for p := range int32(2) {
				inboxTake(t, s, runner.TP{Topic: "t", Partition: p}, -1)
			}
			apply := m.apply(s)
			for off := range int64(10) {
				if off == 4 {
					continue // offset 4 was dead-lettered
				}
				noErrors(t, "the origins", apply(ctx, inboxRec("t", 0, off)))
			}
			if _, err := s.Prune(ctx, runner.TP{Topic: "t", Partition: 0}, 8); err != nil {
				t.Fatal(err)
			}
			before := inboxCount(t, pool, "SELECT count(*) FROM effects")
			for _, off := range []int64{3, 4} { // applied, dead-lettered: below the mark both are unknown
				red := inboxRedriven(1, 50+off, inboxRec("t", 0, off))
				err := apply(ctx, red)[0]
				var ob *inbox.OriginBelowMarkError
				if !errors.As(err, &ob) || runner.KindOf(err) != runner.PermanentKind || ob.Origin != fmt.Sprintf("t/0@%d", off) {
					t.Fatalf("redrive of t/0@%d below the mark: %v (kind %v), want *OriginBelowMarkError, permanent", off, err, runner.KindOf(err))
				}
				if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE topic = 't' AND partition = 1 AND "offset" = $1`, red.Offset); n != 0 {
					t.Fatalf("the refused redrive left %d rows of its own", n)
				}
			}
			if after := inboxCount(t, pool, "SELECT count(*) FROM effects"); after != before {
				t.Fatalf("%d effects ran for refused redrives", after-before)
			}
			// Above the mark (8, 9 kept): decided from the rows.
			noErrors(t, "redrive above the mark", apply(ctx, inboxRedriven(1, 60, inboxRec("t", 0, 9))))
			if after := inboxCount(t, pool, "SELECT count(*) FROM effects"); after != before {
				t.Fatalf("a redrive of an applied origin above the mark ran %d effects", after-before)
			}
		})
	}
}

// inboxRetainedRound runs one retention round of s, with committed as t/0's
// committed offset, and returns t/0's applied mark after it.
func inboxRetainedRound(t *testing.T, pool *pgxpool.Pool, s *inbox.Store, committed int64) int64 {
	t.Helper()
	t0 := runner.TP{Topic: "t", Partition: 0}
	_, ran, err := s.RetentionRound(context.Background(), func(context.Context, []runner.TP) (map[runner.TP]int64, error) {
		return map[runner.TP]int64{t0: committed}, nil
	})
	if err != nil || !ran {
		t.Fatalf("retention round: ran %v, %v", ran, err)
	}
	return inboxCount(t, pool, `SELECT applied_below FROM tidemark_lease WHERE group_id = 'g' AND topic = 't' AND partition = 0`)
}

// TestInboxRetainForKeepsADeadLetterRedrivable: with RetainFor(d), a dead
// letter stays redrivable for d after the group's committed offset passed
// it. It has no row to stop the mark, and its neighbours may be old (t/0@0
// to 3, applied long before) or absent: a retention round right after the
// dead-lettering raises the mark only to a committed offset seen at least
// d ago, so the redrive is applied. Once d has passed, a round raises the
// mark past the other dead letter, and its redrive is refused as before.
func TestInboxRetainForKeepsADeadLetterRedrivable(t *testing.T) {
	t.Parallel()
	const d = 2 * time.Second
	ctx := context.Background()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g", inbox.RetainRecords(0), inbox.RetainFor(d))
	for p := range int32(2) {
		inboxTake(t, s, runner.TP{Topic: "t", Partition: p}, -1)
	}
	h := s.Handler(inboxEffect("a"))
	for off := range int64(4) {
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE tidemark_inbox SET applied_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{5, 7, 8, 9} { // 4 and 6 were dead-lettered
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatal(err)
		}
	}
	if mark := inboxRetainedRound(t, pool, s, 10); mark > 4 {
		t.Logf("retention raised t/0's applied mark to %d, past the dead letter t/0@4", mark)
	}
	if err := h(ctx, inboxRedriven(1, 50, inboxRec("t", 0, 4))); err != nil {
		t.Fatalf("redrive of t/0@4 within RetainFor of its dead-lettering: %v", err)
	}
	if n := inboxEffectsOf(t, pool, inboxRec("t", 0, 4)); n != 1 {
		t.Fatalf("%d effects of the redriven t/0@4, want 1", n)
	}
	if mark := inboxRetainedRound(t, pool, s, 10); mark > 4 {
		t.Fatalf("a second round within RetainFor raised the mark to %d, past the dead letter t/0@6", mark)
	}

	time.Sleep(d + 200*time.Millisecond)
	if mark := inboxRetainedRound(t, pool, s, 10); mark != 10 {
		t.Fatalf("a round after RetainFor left the mark at %d, want 10", mark)
	}
	err := h(ctx, inboxRedriven(1, 51, inboxRec("t", 0, 6)))
	var ob *inbox.OriginBelowMarkError
	if !errors.As(err, &ob) || runner.KindOf(err) != runner.PermanentKind || ob.Origin != "t/0@6" {
		t.Fatalf("redrive of t/0@6 after RetainFor: %v (kind %v), want *OriginBelowMarkError, permanent", err, runner.KindOf(err))
	}
	if n := inboxEffectsOf(t, pool, inboxRec("t", 0, 6)); n != 0 {
		t.Fatalf("%d effects of the refused redrive of t/0@6", n)
	}
}

// TestInboxRedriveFencing: the redriven record is fenced by the lease of
// the partition it was consumed from, never by its origin partition's.
// Member A holds t/1 and redrives a record whose origin t/0 member B
// holds: A applies it. A redrive whose partition's lease moves to B while
// its effect runs is fenced, leaves no origin row, and B applies it once.
func TestInboxRedriveFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	a := inboxStore(t, pool, "g", inbox.Owner("a"))
	b := inboxStore(t, pool, "g", inbox.Owner("b"))
	t0, t1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	inboxTake(t, b, t0, -1)
	inboxTake(t, a, t1, -1)

	first := inboxRec("t", 0, 7)
	if err := a.Handler(inboxEffect("a"))(ctx, inboxRedriven(1, 3, first)); err != nil {
		t.Fatalf("a redrive on A's partition of an origin on B's: %v", err)
	}
	if n := inboxEffectsOf(t, pool, first); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}

	second := inboxRec("t", 0, 8)
	red := inboxRedriven(1, 4, second)
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failing test must not leave the effect waiting
	done := make(chan error, 1)
	go func() {
		done <- a.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			close(inside)
			<-release
			return inboxEffect("a")(ctx, tx, rec)
		})(ctx, red)
	}()
	<-inside
	inboxTake(t, b, t1, -1) // t/1 moves to B while A's effect runs
	open()
	if err := <-done; !errors.Is(err, runner.ErrFenced) {
		t.Fatalf("A's redrive after the bump: %v, want ErrFenced", err)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE topic = 't' AND partition = 0 AND "offset" = 8`); n != 0 {
		t.Fatalf("the fenced redrive left %d origin rows", n)
	}
	if err := b.Handler(inboxEffect("b"))(ctx, red); err != nil {
		t.Fatalf("B's replay of the redrive: %v", err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE value = $1 AND owner = 'b'", string(second.Value)); n != 1 {
		t.Fatalf("%d effects by B, want 1", n)
	}
	if n := inboxEffectsOf(t, pool, second); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestInboxRedriveRacesTheOrigin: the origin record applied again (after
// an offset reset) while its redrive's transaction is open waits for it
// and is a replay once it commits; one effect.
func TestInboxRedriveRacesTheOrigin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g")
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 1}, -1)
	origin := inboxRec("t", 0, 11)
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failing test must not leave the effect waiting
	redrive := make(chan error, 1)
	go func() {
		redrive <- s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			close(inside)
			<-release
			return inboxEffect("redrive")(ctx, tx, rec)
		})(ctx, inboxRedriven(1, 2, origin))
	}()
	<-inside
	again := make(chan error, 1)
	go func() { again <- s.Handler(inboxEffect("origin"))(ctx, origin) }()
	// The origin's claim waits on the redrive's origin row.
	inboxWaitRows(t, pool, 1, 10*time.Second, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
		AND application_name = current_setting('application_name')`)
	open()
	if err := <-redrive; err != nil {
		t.Fatalf("redrive: %v", err)
	}
	if err := <-again; err != nil {
		t.Fatalf("origin: %v", err)
	}
	if n := inboxEffectsOf(t, pool, origin); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = 'redrive'"); n != 1 {
		t.Fatalf("the redrive's effect is not the one: %d", n)
	}
}

// TestInboxRedriveEffectFailsInABatch: in a batch (each record in its own
// savepoint), a redriven record whose effect fails is rolled back with its
// origin row — not only its own — so its retry applies it; the other
// records of the batch commit.
func TestInboxRedriveEffectFailsInABatch(t *testing.T) {
	t.Parallel()
	for _, queued := range []bool{false, true} {
		t.Run(fmt.Sprint("queued ", queued), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			// BatchWait: the three records share a transaction.
			s := inboxStore(t, pool, "g", inbox.Batch(8), inbox.BatchWait(200*time.Millisecond))
			inboxTake(t, s, runner.TP{Topic: "t", Partition: 1}, -1)
			h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
				if string(rec.Value) == "bad" {
					return errors.New("bad record")
				}
				return inboxEffect("a")(ctx, tx, rec)
			})
			if queued {
				h = s.QueuedHandler(inboxQueuedEffect("a"))
			}
			origin := inboxRec("t", 0, 9)
			origin.Value = []byte("bad")
			recs := []runner.Record{inboxRec("t", 1, 30), inboxRedriven(1, 31, origin), inboxRec("t", 1, 32)}
			errs := perRecord(func(*inbox.Store) runner.Handler { return h })(s)(ctx, recs...)
			if errs[0] != nil || errs[1] == nil || errs[2] != nil {
				t.Fatalf("errors %v, want only the redriven record's", errs)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE partition = 0`); n != 0 {
				t.Fatalf("the failed redrive left %d origin rows", n)
			}
			fixed := recs[1]
			fixed.Value = []byte("fixed")
			if err := h(ctx, fixed); err != nil {
				t.Fatalf("the redrive again: %v", err)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE value = 'fixed'`); n != 1 {
				t.Fatalf("%d effects of the fixed redrive, want 1", n)
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE partition = 0 AND "offset" = 9`); n != 1 {
				t.Fatalf("%d origin rows after the redrive applied, want 1", n)
			}
		})
	}
}

// TestInboxUpgradeFromVersion2: a database at version 2, with rows the
// build of version 2 wrote (its claim is this build's claim), migrates to
// this version (3, then 4) with them: the fence still fences their
// partition, an origin applied at version 2 is a replay for a redrive, and
// one it never applied is applied once. MigrateTo stops at the version
// asked.
func TestInboxUpgradeFromVersion2(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := bed.PG(t)
	if _, err := pool.Exec(ctx, inboxEffectsDDL); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, inbox.MigrateTo(2)); err != nil {
		t.Fatal(err)
	}
	if v, err := inbox.Version(ctx, pool); err != nil || v != 2 {
		t.Fatalf("version %d, %v after MigrateTo(2)", v, err)
	}
	s := inboxStore(t, pool, "g")
	if err := s.Check(ctx); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("Check at version 2: %v, want ErrNotMigrated", err)
	}
	t0 := runner.TP{Topic: "t", Partition: 0}
	inboxTake(t, s, t0, -1)
	h := s.Handler(inboxEffect("v2"))
	for off := range int64(3) {
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatalf("applying at version 2: %v", err)
		}
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate from version 2: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 1}, -1)
	if err := h(ctx, inboxRedriven(1, 0, inboxRec("t", 0, 1))); err != nil {
		t.Fatal(err)
	}
	if err := h(ctx, inboxRedriven(1, 1, inboxRec("t", 0, 7))); err != nil {
		t.Fatal(err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 4 {
		t.Fatalf("%d effects, want 4 (three at version 2, the redrive of t/0@7)", n)
	}
	inboxUpgraded(t, pool)
	other := inboxStore(t, pool, "g")
	inboxTake(t, other, t0, -1)
	if err := h(ctx, inboxRec("t", 0, 3)); !errors.Is(err, runner.ErrFenced) {
		t.Fatalf("after another member's bump: %v, want ErrFenced", err)
	}
}

// TestInboxUpgradeFromVersion3: a database at version 3, with rows and an
// origin row the build of version 3 wrote (its claim is this build's
// claim), migrates to version 4 with them. At version 3 this build's
// retention with RetainFor is refused as not migrated (it needs version
// 4's bounds); after the migration the origin applied at version 3 is a
// replay for a second redrive, the first round with RetainFor raises no
// mark, and the fence still fences the partition.
func TestInboxUpgradeFromVersion3(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := bed.PG(t)
	if _, err := pool.Exec(ctx, inboxEffectsDDL); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, pool, inbox.MigrateTo(3)); err != nil {
		t.Fatal(err)
	}
	if v, err := inbox.Version(ctx, pool); err != nil || v != 3 {
		t.Fatalf("version %d, %v after MigrateTo(3)", v, err)
	}
	s := inboxStore(t, pool, "g", inbox.RetainRecords(0), inbox.RetainFor(time.Hour))
	if err := s.Check(ctx); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("Check at version 3: %v, want ErrNotMigrated", err)
	}
	t0 := runner.TP{Topic: "t", Partition: 0}
	inboxTake(t, s, t0, -1)
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 1}, -1)
	h := s.Handler(inboxEffect("v3"))
	for off := range int64(3) {
		if err := h(ctx, inboxRec("t", 0, off)); err != nil {
			t.Fatalf("applying at version 3: %v", err)
		}
	}
	if err := h(ctx, inboxRedriven(1, 0, inboxRec("t", 0, 5))); err != nil {
		t.Fatalf("redrive at version 3: %v", err)
	}
	if _, err := s.Prune(ctx, t0, 3); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("Prune with RetainFor at version 3: %v, want ErrNotMigrated", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate from version 3: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h(ctx, inboxRedriven(1, 1, inboxRec("t", 0, 5))); err != nil {
		t.Fatal(err)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 4 {
		t.Fatalf("%d effects, want 4 (three records and one redrive at version 3; the second redrive is a replay)", n)
	}
	if mark := inboxRetainedRound(t, pool, s, 3); mark != 0 {
		t.Fatalf("the first round with RetainFor after the upgrade raised the mark to %d", mark)
	}
	inboxUpgraded(t, pool)
	other := inboxStore(t, pool, "g")
	inboxTake(t, other, t0, -1)
	if err := h(ctx, inboxRec("t", 0, 3)); !errors.Is(err, runner.ErrFenced) {
		t.Fatalf("after another member's bump: %v, want ErrFenced", err)
	}
}

// inboxUpgraded checks a database an upgrade test migrated: it is at
// SchemaVersion, and retention with RetainFor remembers the bound it was
// given (in a group of its own) and, the bound being new, raises no mark.
func inboxUpgraded(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if v, err := inbox.Version(ctx, pool); err != nil || v != inbox.SchemaVersion {
		t.Fatalf("version %d, %v after the upgrade, want %d", v, err, inbox.SchemaVersion)
	}
	s := inboxStore(t, pool, "upgraded", inbox.RetainRecords(0), inbox.RetainFor(time.Hour))
	tp := runner.TP{Topic: "t", Partition: 0}
	inboxTake(t, s, tp, -1)
	if n, err := s.Prune(ctx, tp, 5); err != nil || n != 0 {
		t.Fatalf("Prune with RetainFor after the upgrade: %d, %v; want nothing pruned", n, err)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox_bounds WHERE group_id = 'upgraded' AND bound = 5`); n != 1 {
		t.Fatalf("%d bounds remembered, want 1", n)
	}
	if n := inboxCount(t, pool, `SELECT applied_below FROM tidemark_lease WHERE group_id = 'upgraded'`); n != 0 {
		t.Fatalf("applied mark %d after a first Prune with RetainFor, want 0", n)
	}
}

// TestInboxRedriveWithAnOriginTopicPostgreSQLRefuses: a record whose origin
// topic header is not UTF-8 (no Kafka topic is) fails alone, with
// ErrBadOrigin, permanent; the records sharing its transaction (a Batch, a
// BatchHandler's batch) apply, as beside an undecidable origin: else each
// attempt fails them all and the policy gives up good records with it.
func TestInboxRedriveWithAnOriginTopicPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	for _, m := range inboxModes {
		t.Run(m.name, func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			s := inboxStore(t, pool, "g", inbox.Batch(m.batch))
			inboxTake(t, s, runner.TP{Topic: "t", Partition: 1}, -1)
			bad := inboxRedriven(1, 7, inboxRec("t", 0, 3))
			bad.Headers[0].Value = []byte("t\xff")
			good := inboxRec("t", 1, 8)
			errs := m.apply(s)(ctx, bad, good)
			if !errors.Is(errs[0], inbox.ErrBadOrigin) || runner.KindOf(errs[0]) != runner.PermanentKind {
				t.Errorf("the record with a non-UTF-8 origin topic: %v (kind %v), want ErrBadOrigin, permanent", errs[0], runner.KindOf(errs[0]))
			}
			if m.name != "BatchHandler" && errs[1] != nil {
				// A BatchHandler's batch has one error, the bad record's.
				t.Errorf("a good record beside it: %v", errs[1])
			}
			if n := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE partition = 1 AND "offset" = 8`); n != 1 {
				t.Errorf("%d effects of the good record beside it, want 1", n)
			}
		})
	}
}

// TestInboxRedriveTwiceOnTwoMembers: one dead letter redriven twice, the
// copies landing on partitions of two members (A holds t/1, B t/2), at
// once. While A's effect runs, B's claim waits on A's origin row; if A's
// effect fails, B applies the event; if A commits, B's copy is a replay.
// Either way the event is applied once.
func TestInboxRedriveTwiceOnTwoMembers(t *testing.T) {
	t.Parallel()
	for _, aFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("A fails %v", aFails), func(t *testing.T) {
			ctx := context.Background()
			pool := inboxDB(t)
			a := inboxStore(t, pool, "g", inbox.Owner("a"))
			b := inboxStore(t, pool, "g", inbox.Owner("b"))
			inboxTake(t, a, runner.TP{Topic: "t", Partition: 1}, -1)
			inboxTake(t, b, runner.TP{Topic: "t", Partition: 2}, -1)
			origin := inboxRec("t", 0, 5)
			inside, release := make(chan struct{}), make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				aDone <- a.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
					if err := inboxEffect("a")(ctx, tx, rec); err != nil {
						return err
					}
					close(inside)
					<-release
					if aFails {
						return errors.New("A's effect failed")
					}
					return nil
				})(ctx, inboxRedriven(1, 30, origin))
			}()
			<-inside
			bDone := make(chan error, 1)
			go func() { bDone <- b.Handler(inboxEffect("b"))(ctx, inboxRedriven(2, 40, origin)) }()
			select {
			case err := <-bDone:
				t.Fatalf("B's redrive returned (%v) while A's, of the same origin, was uncommitted", err)
			case <-time.After(300 * time.Millisecond): // B waits on A's origin row
			}
			close(release)
			if err := <-aDone; (err != nil) != aFails {
				t.Fatalf("A: %v", err)
			}
			if err := <-bDone; err != nil {
				t.Fatalf("B: %v", err)
			}
			if n := inboxEffectsOf(t, pool, origin); n != 1 {
				t.Fatalf("%d effects of one event redriven twice on two members, want 1", n)
			}
		})
	}
}
