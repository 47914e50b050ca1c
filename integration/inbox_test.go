//go:build integration

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/internal/pgtrace"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// The inbox tests. The first group drives Stores directly against the
// test bed's PostgreSQL (no broker), where every interleaving can be forced
// deterministically; the second runs members over the real broker.

// inboxEffectsDDL is the business table of the tests: one row per effect, with
// no unique constraint, so an effect applied twice shows up as two rows
// instead of an error.
const inboxEffectsDDL = `CREATE TABLE effects (
	id        bigserial PRIMARY KEY,
	topic     text   NOT NULL,
	partition int    NOT NULL,
	"offset"  bigint NOT NULL,
	key       text,
	value     text,
	owner     text
)`

// inboxDB returns a pool on a fresh schema with the inbox migrated and the
// effects table created.
func inboxDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := bed.PG(t)
	ctx := context.Background()
	if err := inbox.Migrate(ctx, pool, inbox.Logger(kafkatest.Logger(t))); err != nil {
		t.Fatalf("inbox.Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, inboxEffectsDDL); err != nil {
		t.Fatalf("creating effects: %v", err)
	}
	return pool
}

func inboxStore(t testing.TB, pool *pgxpool.Pool, group string, opts ...inbox.Option) *inbox.Store {
	t.Helper()
	s, err := inbox.New(pool, group, append([]inbox.Option{inbox.Logger(kafkatest.Logger(t))}, opts...)...)
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	return s
}

// writeEffect is the Effect of most tests: one row in effects.
func inboxEffect(owner string) inbox.Effect {
	return func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (topic, partition, "offset", key, value, owner) VALUES ($1, $2, $3, $4, $5, $6)`,
			rec.Topic, rec.Partition, rec.Offset, string(rec.Key), string(rec.Value), owner)
		return err
	}
}

// take runs s's assign hook for tp as the runner would and returns the
// filter.
func inboxTake(t testing.TB, s *inbox.Store, tp runner.TP, start int64) runner.Applied {
	t.Helper()
	fs, err := s.AssignHook()(context.Background(), []runner.Assignment{{TP: tp, Start: start}})
	if err != nil {
		t.Fatalf("assign hook for %s: %v", tp, err)
	}
	return fs[0]
}

// inboxDedupStore is a fresh database, a Store of group g on it that
// deduplicates by the message-id header with batch records to a
// transaction and holds the leases of t/0 and t/1 from the start, and that
// Store's handler of inboxEffect("a"): the dedup tests' set-up.
func inboxDedupStore(t *testing.T, batch int) (*pgxpool.Pool, *inbox.Store, runner.Handler) {
	t.Helper()
	pool := inboxDB(t)
	s := inboxStore(t, pool, "g", inbox.DedupHeader("message-id"), inbox.Batch(batch))
	for p := range int32(2) {
		inboxTake(t, s, runner.TP{Topic: "t", Partition: p}, -1)
	}
	return pool, s, s.Handler(inboxEffect("a"))
}

func inboxRec(topic string, partition int32, offset int64) runner.Record {
	return runner.Record{Topic: topic, Partition: partition, Offset: offset,
		Key: []byte(fmt.Sprintf("k%d", offset%7)), Value: []byte(fmt.Sprint(offset))}
}

func inboxCount(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestInboxMigrateConcurrently: four goroutines (four replicas starting at
// once) migrate the same fresh schema; all succeed, the schema is created
// once, and a later Migrate is a no-op. The command `tidemark inbox
// migrate` does the same on another schema, twice.
func TestInboxMigrateConcurrently(t *testing.T) {
	t.Parallel()
	pool := bed.PG(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inbox.Migrate(ctx, pool, inbox.Logger(kafkatest.Logger(t)))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migration %d: %v", i, err)
		}
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox_migrations"); n != int64(inbox.SchemaVersion) {
		t.Fatalf("%d migration rows, want %d (one per version)", n, inbox.SchemaVersion)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	s := inboxStore(t, pool, "g")
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after Migrate: %v", err)
	}

	// The command, on a schema of its own given with --schema.
	other := bed.PG(t)
	schema := other.Config().ConnConfig.RuntimeParams["search_path"]
	bin := inboxBuildTidemark(t)
	for i, want := range []string{fmt.Sprintf("migrated schema %s to version %d", schema, inbox.SchemaVersion), fmt.Sprintf("already at version %d", inbox.SchemaVersion)} {
		out, err := exec.Command(bin, "inbox", "migrate", "--dsn", os.Getenv("TIDEMARK_PG_DSN"), "--schema", schema).CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("tidemark inbox migrate (run %d): %v\n%s\nwant %q", i+1, err, out, want)
		}
	}
	if n := inboxCount(t, other, "SELECT count(*) FROM tidemark_inbox_migrations"); n != int64(inbox.SchemaVersion) {
		t.Fatalf("the command left %d migration rows, want %d", n, inbox.SchemaVersion)
	}
}

var (
	inboxBin     string
	inboxBinOnce sync.Once
	inboxBinErr  error
)

// buildTidemark builds cmd/tidemark once per test binary.
func inboxBuildTidemark(t testing.TB) string {
	t.Helper()
	inboxBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tidemark-inbox-test")
		if err != nil {
			inboxBinErr = err
			return
		}
		inboxBin = filepath.Join(dir, "tidemark")
		out, err := exec.Command("go", "build", "-o", inboxBin, "github.com/tidemark/tidemark/cmd/tidemark").CombinedOutput()
		if err != nil {
			inboxBinErr = fmt.Errorf("go build cmd/tidemark: %v\n%s", err, out)
		}
	})
	if inboxBinErr != nil {
		t.Fatal(inboxBinErr)
	}
	return inboxBin
}

// TestInboxStartErrors: a wrong DSN and a missing schema are clear errors
// at start — from Check, from the assign hook, and from the command —
// never a hang or a silent retry loop.
func TestInboxStartErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A schema nobody migrated.
	pool := bed.PG(t)
	s := inboxStore(t, pool, "g")
	err := s.Check(ctx)
	if !errors.Is(err, inbox.ErrNotMigrated) || !strings.Contains(err.Error(), "tidemark inbox migrate") {
		t.Fatalf("Check on an empty schema: %v, want ErrNotMigrated naming the command", err)
	}
	_, err = s.AssignHook()(ctx, []runner.Assignment{{TP: runner.TP{Topic: "t", Partition: 0}, Start: -1}})
	if !errors.Is(err, inbox.ErrNotMigrated) {
		t.Fatalf("assign hook on an empty schema: %v, want ErrNotMigrated", err)
	}

	// A server that is not there.
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	nowhere, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nowhere.Close()
	s2 := inboxStore(t, nowhere, "g")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = s2.Check(cctx)
	if err == nil || !strings.Contains(err.Error(), "cannot use PostgreSQL") {
		t.Fatalf("Check with a wrong DSN: %v, want an error saying PostgreSQL cannot be used", err)
	}

	// The command with a wrong DSN, and without one.
	bin := inboxBuildTidemark(t)
	out, err := exec.Command(bin, "inbox", "migrate", "--dsn", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "cannot use PostgreSQL") {
		t.Fatalf("tidemark inbox migrate with a wrong DSN: %v\n%s", err, out)
	}
}

// TestInboxEffectAndRowInOneTransaction: the effect and the inbox row
// commit together or not at all. A handler that fails after writing its
// effect leaves neither; so does one that panics; the next attempt applies
// both once; a replay applies nothing, does not call the effect, and
// counts an idempotency conflict.
func TestInboxEffectAndRowInOneTransaction(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	s := inboxStore(t, pool, "g")
	tp := runner.TP{Topic: "orders", Partition: 3}
	inboxTake(t, s, tp, -1)

	var calls atomic.Int32
	var fail atomic.Value // "error", "panic" or ""
	fail.Store("error")
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		calls.Add(1)
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		switch fail.Load() {
		case "error":
			return errors.New("downstream validation failed")
		case "panic":
			panic("effect panicked")
		}
		return nil
	})
	r := inboxRec(tp.Topic, tp.Partition, 42)
	both := func() (effects, rows int64) {
		return inboxCount(t, pool, "SELECT count(*) FROM effects"), inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox")
	}

	err := h(ctx, r)
	if err == nil || !strings.Contains(err.Error(), "orders/3@42") {
		t.Fatalf("failing effect: %v, want its error naming orders/3@42", err)
	}
	if e, n := both(); e != 0 || n != 0 {
		t.Fatalf("after a failed effect: %d effects and %d inbox rows, want none", e, n)
	}

	fail.Store("panic")
	func() {
		defer func() {
			if v := recover(); v == nil {
				t.Fatal("the panic did not reach the caller (the runner recovers it)")
			}
		}()
		_ = h(ctx, r)
	}()
	if e, n := both(); e != 0 || n != 0 {
		t.Fatalf("after a panicking effect: %d effects and %d inbox rows, want none", e, n)
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired after the panic", st.AcquiredConns())
	}

	fail.Store("")
	if err := h(ctx, r); err != nil {
		t.Fatalf("succeeding effect: %v", err)
	}
	if e, n := both(); e != 1 || n != 1 {
		t.Fatalf("after success: %d effects and %d inbox rows, want 1 and 1", e, n)
	}
	before := calls.Load()
	for range 3 {
		if err := h(ctx, r); err != nil {
			t.Fatalf("replay: %v", err)
		}
	}
	if e, n := both(); e != 1 || n != 1 {
		t.Fatalf("after replays: %d effects and %d inbox rows, want 1 and 1", e, n)
	}
	if c := calls.Load(); c != before {
		t.Fatalf("the effect ran %d times on replays, want 0", c-before)
	}
	if st := s.Stats(); st.Replays != 3 || st.Applied != 1 {
		t.Fatalf("stats %+v, want 3 replays and 1 applied", st)
	}
}

// inboxTracedStore is the round-trip tests' set-up: a fresh database (base,
// untraced, to count the effects on) and a Store of group g on a pool of
// one connection that tr traces, holding the lease of t/0, with batch
// records to a transaction and a long BatchWait: a batch of exactly batch
// records waits for all of them and goes in one transaction.
func inboxTracedStore(t *testing.T, batch int) (base *pgxpool.Pool, s *inbox.Store, tr *pgtrace.RoundTrips) {
	t.Helper()
	base = inboxDB(t)
	tr = &pgtrace.RoundTrips{}
	s = inboxStore(t, inboxTracedPool(t, base, 1, tr), "g", inbox.Batch(batch), inbox.BatchWait(time.Minute))
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	return base, s, tr
}

// inboxApplyFrom runs h at once for n records of t/0 at offsets from,
// from+1, ... and returns each one's result.
func inboxApplyFrom(h runner.Handler, from int64, n int) []error {
	recs := make([]runner.Record, n)
	for i := range recs {
		recs[i] = inboxRec("t", 0, from+int64(i))
	}
	return inboxApplyAll(h, recs)
}

// inboxWantRoundTrips fails t unless tr counted want round trips for the
// records since its last Reset.
func inboxWantRoundTrips(t *testing.T, tr *pgtrace.RoundTrips, records int, want int64) {
	t.Helper()
	if n := tr.Total(); n != want {
		t.Fatalf("%d records took %d round trips (%d queries, %d batches, %d prepares), want %d",
			records, n, tr.Queries.Load(), tr.Batches.Load(), tr.Prepares.Load(), want)
	}
}

// TestInboxEffectRoundTrips: an Effect's record one per transaction costs
// three round trips when applied — BEGIN with the claim, the effect's
// statement, COMMIT — and two when it is a replay or its effect fails
// before any statement (the claim, ROLLBACK); a full Batch(4) costs one
// for the claim, one per effect (its savepoint travels with the effect's
// statement) and one for the COMMIT. Counted with a pgx tracer, on a
// connection that has prepared the statements.
func TestInboxEffectRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		batch   int
		records int
		fail    bool // the effect returns an error before any statement
		replay  bool // the records were applied before
		want    int64
	}{
		{"one per transaction", 1, 1, false, false, 3},
		{"one per transaction, replay", 1, 1, false, true, 2},
		{"one per transaction, effect fails", 1, 1, true, false, 2},
		{"batch of 4", 4, 4, false, false, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, s, tr := inboxTracedStore(t, tc.batch)
			var fail atomic.Bool
			h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
				if fail.Load() {
					return errors.New("refused by the effect")
				}
				return inboxEffect("a")(ctx, tx, rec)
			})
			for i, err := range inboxApplyFrom(h, 0, tc.records) { // prepares the statements on the connection
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			from := int64(1000)
			if tc.replay {
				from = 0
			}
			fail.Store(tc.fail)
			tr.Reset()
			for i, err := range inboxApplyFrom(h, from, tc.records) {
				if (err != nil) != tc.fail {
					t.Fatalf("record %d: %v, want an error: %v", i, err, tc.fail)
				}
			}
			inboxWantRoundTrips(t, tr, tc.records, tc.want)
			want := int64(2 * tc.records)
			if tc.fail || tc.replay {
				want = int64(tc.records)
			}
			if n := inboxCount(t, base, "SELECT count(*) FROM effects"); n != want {
				t.Fatalf("%d effects, want %d", n, want)
			}
			if st := s.Stats(); (st.Batches != 0) != (tc.batch > 1) {
				t.Fatalf("stats %+v: Batches counts only the transactions of Batch > 1", st)
			}
		})
	}
}

// TestInboxDedupKey: with DedupHeader, a second record carrying the same
// message-id at another offset is a replay; records without the header are
// deduplicated by offset only.
func TestInboxDedupKey(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			pool, s, h := inboxDedupStore(t, batch)
			ctx := context.Background()
			withID := func(r runner.Record, id string) runner.Record {
				r.Headers = []runner.Header{{Key: "message-id", Value: []byte(id)}}
				return r
			}
			for _, r := range []runner.Record{
				withID(inboxRec("t", 0, 1), "m-1"),
				withID(inboxRec("t", 0, 2), "m-1"), // producer retry, next offset
				withID(inboxRec("t", 1, 7), "m-1"), // same id on another partition
				withID(inboxRec("t", 0, 3), "m-2"),
				inboxRec("t", 0, 4),
				inboxRec("t", 0, 4), // replay by offset
			} {
				if err := h(ctx, r); err != nil {
					t.Fatalf("%s: %v", r.String(), err)
				}
			}
			// Two records with one id in flight at once: one effect.
			var wg sync.WaitGroup
			for off := int64(10); off < 20; off++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := h(ctx, withID(inboxRec("t", 0, off), "m-3")); err != nil {
						t.Errorf("offset %d: %v", off, err)
					}
				}()
			}
			wg.Wait()
			if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 4 {
				t.Fatalf("%d effects, want 4 (m-1, m-2, offset 4, m-3)", n)
			}
			if st := s.Stats(); st.Replays != 3+9 {
				t.Fatalf("%d replays, want 12", st.Replays)
			}
		})
	}
}

// TestInboxFencing drives two Stores of one group (two members) against
// one partition and forces each interleaving of an old owner's transaction
// with the new owner's lease bump:
//
//   - an old-owner transaction already committing (holding the lease row
//     FOR SHARE, as the fence trigger does at COMMIT) makes the bump wait
//     until it is done;
//   - an old-owner transaction that was inside its effect when the bump
//     happened cannot commit afterwards: FencedError (runner.ErrFenced),
//     nothing of it remains, and the new owner's replay of the same record
//     (which waited on its inbox row) applies it once;
//   - an old-owner transaction that starts after the bump is fenced at its
//     first statement and never runs its effect.
func TestInboxFencing(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	tp := runner.TP{Topic: "orders", Partition: 0}
	a := inboxStore(t, pool, "g", inbox.Owner("a"))
	b := inboxStore(t, pool, "g", inbox.Owner("b"))
	inboxTake(t, a, tp, -1)
	if e, _ := a.Epoch(tp); e != 1 {
		t.Fatalf("a's epoch %d, want 1", e)
	}

	// 1. A transaction in its commit window blocks the bump. The fence
	// trigger's lock is taken inside COMMIT, so hold the same lock from a
	// plain transaction to stand in for that instant.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var e int64
	if err := holder.QueryRow(ctx, `SELECT epoch FROM tidemark_lease WHERE group_id = 'g' AND topic = $1 AND partition = $2 FOR SHARE`, tp.Topic, tp.Partition).Scan(&e); err != nil {
		t.Fatal(err)
	}
	bumped := make(chan error, 1)
	go func() {
		_, err := b.AssignHook()(ctx, []runner.Assignment{{TP: tp, Start: -1}})
		bumped <- err
	}()
	select {
	case err := <-bumped:
		t.Fatalf("the bump returned (%v) while an old-owner commit held the lease", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bumped; err != nil {
		t.Fatalf("bump: %v", err)
	}
	if e, _ := b.Epoch(tp); e != 2 {
		t.Fatalf("b's epoch %d, want 2", e)
	}

	// Give the partition back to a (epoch 3) for the next case.
	inboxTake(t, a, tp, -1)

	// 2. a's transaction is inside its effect when b bumps.
	inEffect := make(chan struct{})
	release := make(chan struct{})
	aDone := make(chan error, 1)
	r := inboxRec(tp.Topic, tp.Partition, 100)
	go func() {
		aDone <- a.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			if err := inboxEffect("a")(ctx, tx, rec); err != nil {
				return err
			}
			close(inEffect)
			<-release // a GC pause, a slow call: the zombie's moment
			return nil
		})(ctx, r)
	}()
	<-inEffect
	bumpStart := time.Now()
	inboxTake(t, b, tp, -1) // epoch 4: does not wait for a's open transaction
	if d := time.Since(bumpStart); d > 2*time.Second {
		t.Fatalf("the bump waited %v for a transaction that was not committing", d)
	}
	// b's replay of the same record waits on a's uncommitted inbox row.
	bDone := make(chan error, 1)
	go func() { bDone <- b.Handler(inboxEffect("b"))(ctx, r) }()
	select {
	case err := <-bDone:
		t.Fatalf("b applied %s (%v) while a's transaction held its inbox row", r.String(), err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	err = <-aDone
	var fe *inbox.FencedError
	if !errors.Is(err, runner.ErrFenced) || !errors.As(err, &fe) || fe.Epoch != 3 {
		t.Fatalf("a's commit after the bump: %v, want a FencedError for epoch 3 wrapping runner.ErrFenced", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("b's apply: %v", err)
	}
	var owners []string
	rows, _ := pool.Query(ctx, `SELECT owner FROM effects WHERE "offset" = 100`)
	owners, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(owners) != 1 || owners[0] != "b" {
		t.Fatalf("effects of offset 100 by %v (%v), want exactly one, b's", owners, err)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE "offset" = 100 AND epoch = 4`); n != 1 {
		t.Fatalf("%d inbox rows for offset 100 under epoch 4, want 1", n)
	}

	// 3. a starts a transaction after the bump: fenced before its effect.
	var ran atomic.Bool
	err = a.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		ran.Store(true)
		return nil
	})(ctx, inboxRec(tp.Topic, tp.Partition, 101))
	if !errors.Is(err, runner.ErrFenced) || ran.Load() {
		t.Fatalf("a after the bump: %v (effect ran: %v), want ErrFenced before the effect", err, ran.Load())
	}
	if st := a.Stats(); st.Fenced != 2 {
		t.Fatalf("a counted %d fenced transactions, want 2", st.Fenced)
	}
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 1 {
		t.Fatalf("%d effects in all, want 1", n)
	}
}

// TestInboxReplayFilter: the assign hook loads the applied offsets of the
// partition (from the start offset when known, the newest ones otherwise,
// up to ReplayLimit) and its filter answers for exactly those.
func TestInboxReplayFilter(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	tp := runner.TP{Topic: "t", Partition: 0}
	s := inboxStore(t, pool, "g")
	inboxTake(t, s, tp, -1)
	h := s.Handler(inboxEffect("a"))
	applied := map[int64]bool{}
	var sorted []int64
	for off := int64(0); off < 300; off++ {
		if off%50 == 7 { // gaps, as transaction markers leave them
			continue
		}
		if err := h(ctx, inboxRec(tp.Topic, tp.Partition, off)); err != nil {
			t.Fatal(err)
		}
		applied[off] = true
		sorted = append(sorted, off)
	}
	check := func(name string, f runner.Applied, want func(off int64) bool) {
		t.Helper()
		for off := int64(-5); off < 320; off++ {
			got := f != nil && f(off)
			if got != want(off) {
				t.Fatalf("%s: filter(%d) = %v, want %v", name, off, got, want(off))
			}
		}
	}
	check("unknown start", inboxTake(t, s, tp, -1), func(off int64) bool { return applied[off] })
	check("start 120", inboxTake(t, s, tp, 120), func(off int64) bool { return applied[off] && off >= 120 })

	limited := inboxStore(t, pool, "g", inbox.ReplayLimit(100))
	newest := sorted[len(sorted)-100]
	check("newest 100", inboxTake(t, limited, tp, -1), func(off int64) bool { return applied[off] && off >= newest })
	first := slices.Index(sorted, 10)
	check("100 from 10", inboxTake(t, limited, tp, 10), func(off int64) bool {
		return applied[off] && off >= 10 && off <= sorted[first+99]
	})
	none := inboxStore(t, pool, "g", inbox.ReplayLimit(0))
	check("disabled", inboxTake(t, none, tp, -1), func(int64) bool { return false })
	if n := inboxCount(t, pool, "SELECT epoch FROM tidemark_lease"); n != 6 {
		t.Fatalf("lease epoch %d after six assignments, want 6", n)
	}
}

// TestInboxRetention: Prune deletes a partition's rows below the committed
// offset minus the margin and nothing else: not other partitions, not other
// groups, not rows with a dedup key younger than the window, not rows
// younger than RetainFor. RunRetention does it for every leased partition
// from the committed offsets it is given, and two of them running at once
// prune once.
func TestInboxRetention(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	tp0, tp1 := runner.TP{Topic: "t", Partition: 0}, runner.TP{Topic: "t", Partition: 1}
	s := inboxStore(t, pool, "g", inbox.RetainRecords(100), inbox.PruneBatch(64), inbox.DedupHeader("message-id"), inbox.DedupWindow(time.Hour))
	other := inboxStore(t, pool, "other")
	for _, st := range []*inbox.Store{s, other} {
		inboxTake(t, st, tp0, -1)
		inboxTake(t, st, tp1, -1)
	}
	h, ho := s.Handler(inboxEffect("a")), other.Handler(inboxEffect("o"))
	for off := int64(0); off < 1000; off++ {
		r := inboxRec("t", 0, off)
		if off%100 == 0 {
			r.Headers = []runner.Header{{Key: "message-id", Value: []byte(fmt.Sprint("m", off))}}
		}
		for _, hh := range []runner.Handler{h, ho} {
			if err := hh(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if off < 200 {
			if err := h(ctx, inboxRec("t", 1, off)); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows := func(group string, p int) int64 {
		return inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox WHERE group_id = $1 AND partition = $2", group, p)
	}

	n, err := s.Prune(ctx, tp0, 800)
	if err != nil {
		t.Fatal(err)
	}
	// Below 700: 700 rows, 7 of them (0, 100, ..., 600) with a young dedup key.
	if n != 693 || rows("g", 0) != 307 {
		t.Fatalf("pruned %d, %d rows left; want 693 pruned and 307 left", n, rows("g", 0))
	}
	if lo := inboxCount(t, pool, `SELECT min("offset") FROM tidemark_inbox WHERE group_id = 'g' AND partition = 0 AND dedup_key IS NULL`); lo != 701 {
		t.Fatalf("lowest row without a key at %d, want 701 (700 has a key)", lo)
	}
	if rows("g", 1) != 200 || rows("other", 0) != 1000 {
		t.Fatal("Prune touched another partition or group")
	}
	// Keys older than the window go too; rows at or above the bound never.
	if _, err := pool.Exec(ctx, `UPDATE tidemark_inbox SET applied_at = now() - interval '2 hours' WHERE dedup_key IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Prune(ctx, tp0, 800); err != nil || n != 7 {
		t.Fatalf("second Prune: %d, %v; want the 7 expired keys", n, err)
	}
	if n := inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE group_id = 'g' AND partition = 0 AND dedup_key IS NOT NULL`); n != 3 {
		t.Fatalf("%d keyed rows left, want 3 (700, 800, 900: at or above the bound)", n)
	}

	// RetainFor keeps young rows below the bound.
	young := inboxStore(t, pool, "other", inbox.RetainRecords(0), inbox.RetainFor(time.Hour))
	if n, err := young.Prune(ctx, tp0, 1000); err != nil || n != 0 {
		t.Fatalf("Prune with RetainFor: %d, %v; want nothing pruned", n, err)
	}

	// RunRetention, twice at once, with committed offsets from a func.
	committed := func(ctx context.Context, tps []runner.TP) (map[runner.TP]int64, error) {
		return map[runner.TP]int64{tp0: 1000, tp1: 150}, nil
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.RunRetention(rctx, 50*time.Millisecond, committed)
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	// Bound 900 on partition 0: the keys at 700 and 800 have expired, the
	// one at 900 is at the bound. Bound 50 on partition 1.
	for rows("g", 0) != 100 || rows("g", 1) != 150 {
		if time.Now().After(deadline) {
			t.Fatalf("RunRetention left %d and %d rows, want 100 and 150", rows("g", 0), rows("g", 1))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RunRetention returned %v, want context.Canceled", err)
		}
	}
	if rows("other", 0) != 1000 {
		t.Fatal("RunRetention touched another group")
	}
	if st := s.Stats(); st.Pruned != 693+7+200+50 {
		t.Fatalf("pruned %d rows in all, want %d", st.Pruned, 693+7+200+50)
	}
}

// TestInboxRetries: a serialization failure (REPEATABLE READ, two effects
// updating one row) and a deadlock (two effects locking two rows in
// opposite orders) are retried inside the handler: both records of each
// pair succeed, each effect lands once, and the retries are counted.
func TestInboxRetries(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters VALUES (1, 0), (10, 0), (11, 0)`); err != nil {
		t.Fatal(err)
	}
	tp := runner.TP{Topic: "t", Partition: 0}
	bump := func(ctx context.Context, tx pgx.Tx, id int) error {
		_, err := tx.Exec(ctx, "UPDATE counters SET n = n + 1 WHERE id = $1", id)
		return err
	}

	t.Run("serialization", func(t *testing.T) {
		s := inboxStore(t, pool, "ser", inbox.TxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead}))
		inboxTake(t, s, tp, -1)
		secondIn := make(chan struct{})
		firstDone := make(chan struct{})
		var once sync.Once
		h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			switch rec.Offset {
			case 1:
				if err := bump(ctx, tx, 1); err != nil {
					return err
				}
				<-secondIn // the other transaction has its snapshot
			case 2:
				first := false
				once.Do(func() { first = true })
				if first {
					close(secondIn)
					<-firstDone // the first committed after our snapshot
				}
				if err := bump(ctx, tx, 1); err != nil {
					return err
				}
			}
			return inboxEffect("s")(ctx, tx, rec)
		})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h(ctx, inboxRec("t", 0, 2)); err != nil {
				t.Errorf("record 2: %v", err)
			}
		}()
		if err := h(ctx, inboxRec("t", 0, 1)); err != nil {
			t.Fatalf("record 1: %v", err)
		}
		close(firstDone)
		wg.Wait()
		if n := inboxCount(t, pool, "SELECT n FROM counters WHERE id = 1"); n != 2 {
			t.Fatalf("counter %d, want 2", n)
		}
		if st := s.Stats(); st.Retries < 1 || st.Applied != 2 {
			t.Fatalf("stats %+v, want a retry and 2 applied", st)
		}
	})

	t.Run("deadlock", func(t *testing.T) {
		s := inboxStore(t, pool, "dl")
		inboxTake(t, s, tp, -1)
		var locked sync.WaitGroup
		locked.Add(2)
		var first [2]atomic.Bool
		h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			a, b := 10, 11
			if rec.Offset == 4 {
				a, b = 11, 10
			}
			if err := bump(ctx, tx, a); err != nil {
				return err
			}
			if first[rec.Offset-3].CompareAndSwap(false, true) {
				locked.Done()
				locked.Wait() // both hold their first row
			}
			if err := bump(ctx, tx, b); err != nil {
				return err
			}
			return inboxEffect("d")(ctx, tx, rec)
		})
		var wg sync.WaitGroup
		for _, off := range []int64{3, 4} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := h(ctx, inboxRec("t", 0, off)); err != nil {
					t.Errorf("record %d: %v", off, err)
				}
			}()
		}
		wg.Wait()
		if n := inboxCount(t, pool, "SELECT n FROM counters WHERE id = 10") + inboxCount(t, pool, "SELECT n FROM counters WHERE id = 11"); n != 4 {
			t.Fatalf("counters sum to %d, want 4", n)
		}
		if st := s.Stats(); st.Retries < 1 || st.Applied != 2 {
			t.Fatalf("stats %+v, want a retry and 2 applied", st)
		}
	})
	if n := inboxCount(t, pool, "SELECT count(*) FROM effects"); n != 4 {
		t.Fatalf("%d effects, want 4", n)
	}
}

// TestInboxBatch: with Batch, records of a partition in flight together
// share transactions; a record whose effect fails or panics is rolled back
// alone (its savepoint) and the others commit; a record whose ctx ends while
// it waits leaves without its effect; replays apply nothing; and a lease
// bump during a batch fences the whole batch.
func TestInboxBatch(t *testing.T) {
	t.Parallel()
	pool := inboxDB(t)
	ctx := context.Background()
	tp := runner.TP{Topic: "t", Partition: 0}
	s := inboxStore(t, pool, "g", inbox.Batch(16))
	inboxTake(t, s, tp, -1)
	var broken atomic.Bool
	broken.Store(true)
	inGate, gate := make(chan struct{}), make(chan struct{})
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if rec.Offset == 0 {
			close(inGate)
			<-gate // hold the first batch so the others queue behind it
		}
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		if broken.Load() {
			switch rec.Offset {
			case 13:
				return errors.New("bad record")
			case 27:
				panic("effect panicked")
			}
		}
		return nil
	})
	const n = 40
	run := func(offsets []int64, ctxOf func(off int64) context.Context) map[int64]error {
		var mu sync.Mutex
		res := map[int64]error{}
		var wg sync.WaitGroup
		for _, off := range offsets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := h(ctxOf(off), inboxRec("t", 0, off))
				mu.Lock()
				res[off] = err
				mu.Unlock()
			}()
			if off == 0 && len(offsets) == n {
				<-inGate // record 0 leads a batch of its own and holds it
			}
		}
		wg.Wait()
		return res
	}
	all := make([]int64, n)
	for i := range all {
		all[i] = int64(i)
	}
	gone, cancelGone := context.WithCancel(ctx)
	go func() {
		<-inGate
		time.Sleep(200 * time.Millisecond) // the others queue behind record 0
		cancelGone()                       // record 39 gives up while queued
		time.Sleep(100 * time.Millisecond)
		close(gate)
	}()
	res := run(all, func(off int64) context.Context {
		if off == 39 {
			return gone
		}
		return ctx
	})
	for off, err := range res {
		switch off {
		case 13:
			if err == nil || !strings.Contains(err.Error(), "bad record") {
				t.Errorf("record 13: %v, want its error", err)
			}
		case 27:
			if err == nil || !strings.Contains(err.Error(), "panicked") {
				t.Errorf("record 27: %v, want its panic as an error", err)
			}
		case 39:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("record 39: %v, want context.Canceled", err)
			}
		default:
			if err != nil {
				t.Errorf("record %d: %v", off, err)
			}
		}
	}
	if e, r := inboxCount(t, pool, "SELECT count(*) FROM effects"), inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox"); e != n-3 || r != n-3 {
		t.Fatalf("%d effects and %d inbox rows, want %d of each", e, r, n-3)
	}
	st := s.Stats()
	// Record 0 alone, then 38 queued records in batches of up to 16: 4
	// transactions, a few more if the machine was slow to queue them.
	if st.Batches > 8 || st.Applied != n-3 {
		t.Fatalf("stats %+v: want %d applied in at most 8 transactions", st, n-3)
	}
	t.Logf("%d records in %d transactions", st.Applied, st.Batches)

	// The failed ones again, then everything as a replay.
	broken.Store(false)
	res = run([]int64{13, 27, 39}, func(int64) context.Context { return ctx })
	for off, err := range res {
		if err != nil {
			t.Fatalf("record %d again: %v", off, err)
		}
	}
	res = run(all, func(int64) context.Context { return ctx })
	for off, err := range res {
		if err != nil {
			t.Fatalf("replay of %d: %v", off, err)
		}
	}
	if e := inboxCount(t, pool, "SELECT count(*) FROM effects"); e != n {
		t.Fatalf("%d effects after replays, want %d", e, n)
	}
	if st := s.Stats(); st.Replays != n {
		t.Fatalf("%d replays, want %d", st.Replays, n)
	}

	// A bump while a batch runs fences all of it.
	other := inboxStore(t, pool, "g")
	inEffect := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	fh := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		once.Do(func() { close(inEffect); <-release })
		return nil
	})
	errs := make(chan error, 3)
	for off := int64(100); off < 103; off++ {
		go func() { errs <- fh(ctx, inboxRec("t", 0, off)) }()
		if off == 100 {
			<-inEffect
		}
	}
	time.Sleep(100 * time.Millisecond)
	inboxTake(t, other, tp, -1)
	close(release)
	for range 3 {
		if err := <-errs; !errors.Is(err, runner.ErrFenced) {
			t.Fatalf("record of a fenced batch: %v, want ErrFenced", err)
		}
	}
	if e := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" >= 100`); e != 0 {
		t.Fatalf("%d effects of the fenced batches, want 0", e)
	}
}

// --- Over the real broker -------------------------------------------------

// inboxMember starts a group member whose handler is s.Handler(fn) and whose
// runner takes leases with s.AssignHook().
func inboxMember(t *testing.T, name, group, topic string, s *inbox.Store, fn inbox.Effect, opts ...runner.Option) *kafkatest.Member {
	t.Helper()
	return startMember(t, name, group, topic, s.Handler(fn), append([]runner.Option{runner.OnAssign(s.AssignHook()),
		runner.Backoff(20*time.Millisecond, 500*time.Millisecond)}, opts...)...)
}

// inboxExactlyOnce checks that every one of n records has exactly one
// effect row and exactly one inbox row, and that each key's effects landed
// in offset order.
func inboxExactlyOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	inboxExactlyOnceNoOrder(t, pool, n)
	if back := inboxCount(t, pool, `SELECT count(*) FROM (
		SELECT "offset" < lag("offset") OVER (PARTITION BY key ORDER BY id) AS back FROM effects) x WHERE back`); back != 0 {
		t.Fatalf("%d effects landed before an earlier offset of their key", back)
	}
}

// inboxWaitRows waits until sql counts want. It fails when the count
// stood still for within (see stall).
func inboxWaitRows(t *testing.T, pool *pgxpool.Pool, want int64, within time.Duration, sql string, args ...any) {
	t.Helper()
	inboxWait(t, pool, func(n int64) bool { return n == want }, fmt.Sprint(want), within, sql, args...)
}

// inboxWaitAtLeast waits until sql counts want or more; it fails when the
// count stood still for within.
func inboxWaitAtLeast(t *testing.T, pool *pgxpool.Pool, want int64, within time.Duration, sql string, args ...any) {
	t.Helper()
	inboxWait(t, pool, func(n int64) bool { return n >= want }, fmt.Sprintf("at least %d", want), within, sql, args...)
}

func inboxWait(t *testing.T, pool *pgxpool.Pool, ok func(int64) bool, want string, within time.Duration, sql string, args ...any) {
	t.Helper()
	st := newStall(within)
	for {
		n := inboxCount(t, pool, sql, args...)
		if ok(n) {
			return
		}
		if st.over(n) {
			t.Fatalf("%s: %d, want %s: %s", sql, n, want, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inboxResetGroup moves the (empty) group's committed offsets of every
// partition back to 0, as an operator's reset does.
func inboxResetGroup(t *testing.T, group, topic string, partitions int) {
	t.Helper()
	offsets := kadm.Offsets{}
	for p := range int32(partitions) {
		offsets.Add(kadm.Offset{Topic: topic, Partition: p, At: 0, LeaderEpoch: -1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := bed.Admin(t).CommitOffsets(ctx, group, offsets)
		if err == nil {
			err = resp.Error()
		}
		if err == nil {
			return
		}
		// The group may still be finishing the last member's leave.
		if ctx.Err() != nil {
			t.Fatalf("resetting group %s: %v", group, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestInboxEndToEnd: 20,000 keyed records over 6 partitions, two members
// with the inbox (the second with Batch); one shuts down midway and the
// other takes its partitions over. Every record has exactly one effect and one inbox row,
// each key's effects are in offset order, and the group committed the end
// offsets.
func TestInboxEndToEnd(t *testing.T) {
	t.Parallel()
	const n, partitions, keys = 20_000, 6, 500
	pool := inboxDB(t)
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })

	slow := func(owner string) inbox.Effect {
		eff := inboxEffect(owner)
		return func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			if rec.Offset%50 == 0 {
				time.Sleep(2 * time.Millisecond) // some records in flight at any time
			}
			return eff(ctx, tx, rec)
		}
	}
	s1 := inboxStore(t, pool, group, inbox.Owner("m1"))
	// The second member batches: members of a group may differ in that.
	s2 := inboxStore(t, pool, group, inbox.Owner("m2"), inbox.Batch(16), inbox.BatchWait(200*time.Microsecond))
	m1 := inboxMember(t, "m1", group, topic, s1, slow("m1"), runner.Concurrency(32))
	m2 := inboxMember(t, "m2", group, topic, s2, slow("m2"), runner.Concurrency(64))
	inboxWaitAtLeast(t, pool, 1, time.Minute, `SELECT count(*) FROM effects WHERE owner = 'm2'`)
	inboxWaitAtLeast(t, pool, int64(n/2), time.Minute, `SELECT count(*) FROM effects`)
	m1.Stop(t)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 2*time.Minute)
	m2.Stop(t)
	inboxExactlyOnce(t, pool, n)
	byOwner := map[string]int64{}
	for _, o := range []string{"m1", "m2"} {
		byOwner[o] = inboxCount(t, pool, "SELECT count(*) FROM effects WHERE owner = $1", o)
	}
	st1, st2 := s1.Stats(), s2.Stats()
	t.Logf("effects by m1 %d, by m2 %d; m1 %+v; m2 %+v", byOwner["m1"], byOwner["m2"], st1, st2)
	if byOwner["m1"] == 0 || byOwner["m2"] == 0 {
		t.Fatalf("one member applied nothing: %v", byOwner)
	}
}

// TestInboxCloseBeforeKafkaCommit: the crash window between the two
// durable boundaries. A member applies every record (effects committed in
// PostgreSQL) and is closed before it commits anything to Kafka (Close: no
// final commit; the commit interval is longer than the test). The next
// member re-consumes everything from the start: no effect runs again (the
// assign hook's filter skips all of them), the effects are still exactly
// once, and the group's commit reaches the end.
func TestInboxCloseBeforeKafkaCommit(t *testing.T) {
	t.Parallel()
	const n, partitions = 3_000, 3
	pool := inboxDB(t)
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%100) })

	s1 := inboxStore(t, pool, group)
	m1 := inboxMember(t, "m1", group, topic, s1, inboxEffect("m1"), runner.CommitInterval(time.Hour))
	inboxWaitRows(t, pool, n, time.Minute, "SELECT count(*) FROM effects")
	m1.Close(t)
	for p, off := range bed.Committed(t, group, topic) {
		if off >= 0 {
			t.Fatalf("partition %d committed %d before the test wanted any commit", p, off)
		}
	}

	var calls atomic.Int64
	s2 := inboxStore(t, pool, group)
	m2 := inboxMember(t, "m2", group, topic, s2, func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		calls.Add(1)
		return inboxEffect("m2")(ctx, tx, rec)
	})
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	m2.Stop(t)
	inboxExactlyOnce(t, pool, n)
	if c := calls.Load(); c != 0 {
		t.Fatalf("the effect ran %d times on the re-consumption, want 0", c)
	}
	if st := s2.Stats(); st.Loaded != n {
		t.Fatalf("m2 loaded %d applied offsets, want %d", st.Loaded, n)
	}
}

// TestInboxReplay: 50,000 records applied, then the group's offsets reset
// to the start and everything consumed again, twice: once with the assign
// hook's replay filter (no user function, no transaction per record) and
// once without it (ReplayLimit(0): a transaction per record whose inbox
// insert finds the row). Both apply nothing again; the second counts every
// record as an idempotency conflict. The times are logged for
// docs/inbox.md.
func TestInboxReplay(t *testing.T) {
	t.Parallel()
	const n, partitions = 50_000, 6
	pool := inboxDB(t)
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%1000) })

	// pass consumes the whole topic with a fresh member and returns the
	// time from its first assignment to the commit of the end offsets.
	pass := func(name string, opts ...inbox.Option) (time.Duration, int64, *inbox.Store) {
		t.Helper()
		s := inboxStore(t, pool, group, opts...)
		var calls atomic.Int64
		var first atomic.Int64
		hook := s.AssignHook()
		m := startMember(t, name, group, topic, s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			calls.Add(1)
			return inboxEffect(name)(ctx, tx, rec)
		}), runner.Concurrency(64), runner.OnAssign(func(ctx context.Context, as []runner.Assignment) ([]runner.Applied, error) {
			first.CompareAndSwap(0, time.Now().UnixNano())
			return hook(ctx, as)
		}))
		waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 3*time.Minute)
		took := time.Since(time.Unix(0, first.Load()))
		m.Stop(t)
		return took, calls.Load(), s
	}
	applyT, calls, _ := pass("apply")
	if calls != n {
		t.Fatalf("first pass ran the effect %d times, want %d", calls, n)
	}
	inboxResetGroup(t, group, topic, partitions)
	skipT, calls, s := pass("skip")
	if calls != 0 || s.Stats().Loaded != n {
		t.Fatalf("replay with the filter: effect ran %d times, %d offsets loaded; want 0 and %d", calls, s.Stats().Loaded, n)
	}
	inboxResetGroup(t, group, topic, partitions)
	checkT, calls, s := pass("check", inbox.ReplayLimit(0))
	if calls != 0 || s.Stats().Replays != n {
		t.Fatalf("replay without the filter: effect ran %d times, %d conflicts; want 0 and %d", calls, s.Stats().Replays, n)
	}
	inboxExactlyOnce(t, pool, n)
	t.Logf("%d records: applied in %v, replayed with the filter in %v (%.1fx faster), replayed with a transaction each in %v (%.1fx the filter)",
		n, applyT.Round(time.Millisecond), skipT.Round(time.Millisecond), float64(applyT)/float64(skipT),
		checkT.Round(time.Millisecond), float64(checkT)/float64(skipT))
}

// inboxChildEnv names the variable that makes TestInboxHelperProcess run a
// consumer: "topic|group|schema|owner|batch".
const inboxChildEnv = "TIDEMARK_INBOX_CHILD"

// TestInboxHelperProcess is not a test of its own: it is the consumer
// process TestInboxCrashKill9 starts (this test binary, run again) and kills
// with SIGKILL. Without TIDEMARK_INBOX_CHILD it returns at once. The member
// is static (one instance id for every incarnation), so a restarted process
// takes the partitions over at once, as a restarted pod does.
func TestInboxHelperProcess(t *testing.T) {
	spec := os.Getenv(inboxChildEnv)
	if spec == "" {
		return
	}
	f := strings.Split(spec, "|")
	if len(f) != 5 {
		t.Fatalf("%s=%q: want topic|group|schema|owner|batch", inboxChildEnv, spec)
	}
	topic, group, schema, owner := f[0], f[1], f[2], f[3]
	batch, err := strconv.Atoi(f[4])
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := inboxStore(t, pool, group, inbox.Owner(owner), inbox.Batch(batch), inbox.BatchWait(100*time.Microsecond))
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, franz.InstanceID("inbox-crash"),
		franz.SessionTimeout(6*time.Second), franz.HeartbeatInterval(500*time.Millisecond), franz.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(src, runner.Handle(topic, s.Handler(inboxEffect(owner))), runner.OnAssign(s.AssignHook()),
		runner.Concurrency(64), runner.CommitInterval(200*time.Millisecond), runner.Logger(kafkatest.Logger(t)),
		runner.Backoff(20*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runUntilSIGTERM(t, ctx, r)
	fmt.Printf("child %s: %+v\n", owner, s.Stats())
}

// runUntilSIGTERM runs r in a child process until SIGTERM, which starts
// a graceful Shutdown of up to 15 s; it fails t if Run returns an error.
func runUntilSIGTERM(t *testing.T, ctx context.Context, r *runner.Runner) {
	t.Helper()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_ = r.Shutdown(sctx)
	}()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestInboxCrashKill9: the crash window between the database commit and
// the Kafka commit, hit for real. A consumer process applies 100,000 records
// and is killed with SIGKILL at random moments, again and again, and
// restarted; after each kill the test counts the records whose effect had
// committed in PostgreSQL but whose offset had not been committed to Kafka
// (the next process replays them); a process is killed after it applied 1%
// of the records (one in five at once, while it starts), and then a random
// moment of up to 1.5 s. Every other process applies with Batch.
// At the end every record has exactly one
// effect row and one inbox row, each key's effects are in offset order, and
// the group committed the end offsets.
func TestInboxCrashKill9(t *testing.T) {
	t.Parallel()
	const n, partitions = 100_000, 6
	pool := inboxDB(t)
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%2000) })
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]

	logs := t.TempDir()
	start := func(i int) (*exec.Cmd, chan error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInboxHelperProcess$", "-test.count=1")
		// Every other process batches, so the crash window is hit in
		// both modes (and a batched process replays a one-per-transaction
		// one's leftovers, and the other way round).
		batch := 1 + (i%2)*15
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%s|p%d|%d", inboxChildEnv, topic, group, schema, i, batch))
		out, err := os.Create(filepath.Join(logs, fmt.Sprintf("p%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait(); out.Close() }()
		return cmd, done
	}
	effects := func() int64 { return inboxCount(t, pool, "SELECT count(*) FROM effects") }
	// progress is cheap to poll where count(*) is not: the highest effect
	// id (ids of rolled-back inserts are skipped, so it runs ahead of the
	// count, never behind).
	progress := func() int64 { return inboxCount(t, pool, "SELECT coalesce(max(id), 0) FROM effects") }
	// window counts inbox rows at or above the group's committed offsets:
	// applied in the database, not committed in Kafka.
	window := func() int64 {
		var sum int64
		for p, off := range bed.Committed(t, group, topic) {
			sum += inboxCount(t, pool, `SELECT count(*) FROM tidemark_inbox WHERE partition = $1 AND "offset" >= $2`, p, max(off, 0))
		}
		return sum
	}

	// The processes must keep applying: the test fails when the effects
	// stood still for 90s (on a loaded machine 90,000 of them take
	// minutes; see stall).
	st := newStall(90 * time.Second)
	stuck := func() bool { return st.over(progress()) }
	var kills int
	var replayed []int64
	for i := 0; effects() < n*9/10; i++ {
		if stuck() {
			t.Fatalf("%d of %d effects after %d kills: %s", effects(), n, kills, st)
		}
		cmd, done := start(i)
		before := progress()
		if rand.IntN(5) > 0 {
			// Usually wait for progress — 1% of the records, so that the
			// number of kills does not grow on a slow machine — so the
			// run moves on...
			for progress() < before+n/100 && !stuck() {
				time.Sleep(50 * time.Millisecond)
			}
		}
		// ...then kill at a random moment (sometimes while it starts).
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-done
		kills++
		replayed = append(replayed, window())
	}
	cmd, done := start(1000)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 3*time.Minute)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("last process: %v (log in %s)", err, logs)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Errorf("last process did not stop within 30s of SIGTERM")
	}
	inboxExactlyOnce(t, pool, n)
	var hit int
	var total int64
	for _, w := range replayed {
		total += w
		if w > 0 {
			hit++
		}
	}
	t.Logf("%d kills; %d of them between a database commit and its Kafka commit, leaving %d applied records to replay (per kill: %v)",
		kills, hit, total, replayed)
	if kills < 5 || hit < kills/2 {
		t.Fatalf("only %d kills, %d of them in the window: the test did not exercise the crash window", kills, hit)
	}
}

// TestInboxZombie: a worker keeps running after its partition moved on. Member
// A holds one record's transaction open inside its effect (after writing
// it) while member B takes the partition's lease. A is in a Kafka group of
// its own, so nothing tells it that the partition moved — as when A is cut
// off from the group coordinator, or paused, while the database still
// answers; the lease is what both share. B skips what A committed (the
// filter), and its replay of the held record waits on A's inbox row. When A
// resumes, its commit is fenced (runner.ErrFenced) and rolled back, and the
// fenced record holds its key's lane in A, so A tries no later record of
// the key; B applies the held record and the rest of its key once, in
// offset order.
func TestInboxZombie(t *testing.T) {
	t.Parallel()
	const n, keys, held = 200, 10, 50 // record 50 has key-0; key-0 has 20 records
	pool := inboxDB(t)
	topic := bed.Topic(t, 1)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })
	inboxGroup := bed.Group(t)
	sa := inboxStore(t, pool, inboxGroup, inbox.Owner("a"))
	sb := inboxStore(t, pool, inboxGroup, inbox.Owner("b"))

	inEffect := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	aErrs := map[int64]error{}
	ha := sa.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if err := inboxEffect("a")(ctx, tx, rec); err != nil {
			return err
		}
		if string(rec.Value) == fmt.Sprint(held) {
			close(inEffect)
			<-release // deaf to ctx, like a paused process
		}
		return nil
	})
	ma := startMember(t, "a", bed.Group(t), topic, func(ctx context.Context, rec runner.Record) error {
		err := ha(ctx, rec)
		mu.Lock()
		aErrs[rec.Offset] = err
		mu.Unlock()
		return err
	}, runner.OnAssign(sa.AssignHook()))
	select {
	case <-inEffect:
	case <-time.After(time.Minute):
		t.Fatal("A never reached the held record")
	}
	// A commits everything but key-0 from record 50 on: 200 - 15.
	inboxWaitRows(t, pool, n-15, time.Minute, "SELECT count(*) FROM effects")

	groupB := bed.Group(t)
	mb := inboxMember(t, "b", groupB, topic, sb, inboxEffect("b"))
	inboxWaitRows(t, pool, 1, time.Minute, "SELECT count(*) FROM tidemark_lease WHERE owner = 'b'")
	// B completes 0..49 from its filter and stops at the held record.
	waitCommitted(t, groupB, topic, map[int32]int64{0: held}, time.Minute)
	time.Sleep(300 * time.Millisecond)
	if got := bed.Committed(t, groupB, topic)[0]; got != held {
		t.Fatalf("B committed %d while A's transaction held record %d", got, held)
	}
	close(release)
	waitCommitted(t, groupB, topic, bed.EndOffsets(t, topic), time.Minute)
	mb.Stop(t)
	ma.Stop(t)

	mu.Lock()
	heldErr := aErrs[held]
	fenced := 0
	for _, err := range aErrs {
		if errors.Is(err, runner.ErrFenced) {
			fenced++
		}
	}
	mu.Unlock()
	var fe *inbox.FencedError
	if !errors.As(heldErr, &fe) || !errors.Is(heldErr, runner.ErrFenced) {
		t.Fatalf("A's commit of the held record: %v, want a FencedError (runner.ErrFenced)", heldErr)
	}
	if fenced != 1 {
		t.Fatalf("A was fenced on %d records, want 1 (record %d: the rest of key-0 waits behind it)", fenced, held)
	}
	for off, err := range aErrs {
		if off > held && off%keys == held%keys {
			t.Fatalf("A ran record %d of key-0 after the fenced record %d (err %v)", off, held, err)
		}
	}
	inboxExactlyOnce(t, pool, n)
	if owner := inboxCount(t, pool, `SELECT count(*) FROM effects WHERE "offset" = $1 AND owner = 'b'`, held); owner != 1 {
		t.Fatalf("record %d's effect is not B's", held)
	}
	if st := sb.Stats(); st.Loaded != n-15 {
		t.Fatalf("B loaded %d applied offsets, want %d", st.Loaded, n-15)
	}
}

// TestInboxDatabaseOutage: PostgreSQL goes away mid-run — every backend of
// the member is terminated (what a fast shutdown does: FATAL 57P01 to each
// client, transactions in flight rolled back or, in COMMIT, of unknown
// outcome to the client) and new connections are refused for three
// seconds — then comes back. Nothing is applied during the outage, the
// failed attempts are retried by the runner, and at the end every record
// has exactly one effect and the group committed the end offsets. (The
// shared test bed's server is not stopped for real: other tests use it.)
func TestInboxDatabaseOutage(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 16} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) { inboxOutage(t, batch) })
	}
}

func inboxOutage(t *testing.T, batch int) {
	const n, partitions = 10_000, 3
	pool := inboxDB(t)
	topic := bed.Topic(t, partitions)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%300) })

	sw := &netSwitch{}
	app := "inbox-outage-" + fmt.Sprint(rand.Uint32())
	cfg, err := pgxpool.ParseConfig(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pool.Config().ConnConfig.RuntimeParams["search_path"]
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.DialFunc = sw.dial
	cfg.MaxConns = 8
	mpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer mpool.Close()
	s := inboxStore(t, mpool, group, inbox.Batch(batch))
	m := inboxMember(t, "m", group, topic, s, inboxEffect("m"), runner.Concurrency(64))
	inboxWaitAtLeast(t, pool, int64(n/4), time.Minute, `SELECT count(*) FROM effects`)

	sw.refuse() // no reconnecting meanwhile
	// Terminate and wait (up to 5s each) until the backends are gone, so
	// no commit can still land after the count below.
	if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
		t.Fatal(err)
	}
	sw.cut()
	during := inboxCount(t, pool, "SELECT count(*) FROM effects")
	time.Sleep(3 * time.Second)
	if after := inboxCount(t, pool, "SELECT count(*) FROM effects"); after != during {
		t.Fatalf("%d effects applied while the database was away", after-during)
	}
	sw.restore()
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), 2*time.Minute)
	m.Stop(t)
	inboxExactlyOnce(t, pool, n)
	t.Logf("outage at %d of %d effects; %+v", during, n, s.Stats())
}

// --- Benchmarks -------------------------------------------------------------

// BenchmarkInbox measures records applied per second, straight against
// PostgreSQL (no broker), by 128 goroutines (about 21 records in flight per
// partition) over the test bed's pool of 8 connections: the ceiling (one
// autocommitted single-row INSERT, the effect alone), the inbox with one
// record per transaction (the same INSERT as the effect), and the inbox
// with Batch(n), without and with a BatchWait.
func BenchmarkInbox(b *testing.B) {
	const partitions = 6
	run := func(b *testing.B, apply func(ctx context.Context, r runner.Record) error) {
		var next atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(64)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				i := next.Add(1)
				if err := apply(ctx, inboxRec("t", int32(i%partitions), i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	}
	b.Run("insert", func(b *testing.B) {
		pool := inboxDB(b)
		run(b, func(ctx context.Context, r runner.Record) error {
			_, err := pool.Exec(ctx, `INSERT INTO effects (topic, partition, "offset", key, value, owner) VALUES ($1, $2, $3, $4, $5, $6)`,
				r.Topic, r.Partition, r.Offset, string(r.Key), string(r.Value), "bench")
			return err
		})
	})
	for _, mode := range inboxBenchModes {
		b.Run(mode.name, func(b *testing.B) {
			pool := inboxDB(b)
			s := inboxStore(b, pool, "bench", mode.opts...)
			for p := range int32(partitions) {
				inboxTake(b, s, runner.TP{Topic: "t", Partition: p}, -1)
			}
			run(b, s.Handler(inboxEffect("bench")))
			if st := s.Stats(); st.Batches > 0 {
				b.ReportMetric(float64(st.Applied)/float64(st.Batches), "records/tx")
			}
		})
	}
}

// inboxBenchModes are the inbox configurations the benchmarks compare.
var inboxBenchModes = []struct {
	name string
	opts []inbox.Option
}{
	{"inbox-tx", nil},
	{"inbox-batch-32", []inbox.Option{inbox.Batch(32)}},
	{"inbox-batch-32-wait", []inbox.Option{inbox.Batch(32), inbox.BatchWait(200 * time.Microsecond)}},
}

// BenchmarkInboxKafka measures records per second applied exactly once
// through the real broker into PostgreSQL — a member with the inbox, one
// small INSERT per record as the effect — from the member's first
// assignment until every effect is in the table, with runner.Concurrency
// 256, for one record per transaction and for Batch(32) without and with
// BatchWait; beside it, in the same run and on the same
// server, the ceiling: the same number of single-row INSERTs from 8
// connections, and pgbench with the same INSERT. Run it with -benchtime=1x:
// each iteration is a whole run of 30,000 records.
func BenchmarkInboxKafka(b *testing.B) {
	const n, partitions = 30_000, 6
	b.Run("ceiling-insert", func(b *testing.B) {
		for range b.N {
			pool := inboxDB(b)
			var next atomic.Int64
			start := time.Now()
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= n; i = next.Add(1) {
						if _, err := pool.Exec(context.Background(), `INSERT INTO effects (topic, partition, "offset", key, value, owner) VALUES ($1, $2, $3, $4, $5, $6)`,
							"t", int32(i%partitions), i, "k", "v", "bench"); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(n/time.Since(start).Seconds(), "records/s")
		}
	})
	b.Run("ceiling-pgbench", func(b *testing.B) {
		for range b.N {
			pool := inboxDB(b)
			schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
			script := filepath.Join(b.TempDir(), "insert.sql")
			if err := os.WriteFile(script, []byte(`INSERT INTO `+schema+`.effects (topic, partition, "offset", key, value, owner) VALUES ('t', 0, 1, 'k', 'v', 'bench');`+"\n"), 0o644); err != nil {
				b.Fatal(err)
			}
			pgbench, err := exec.LookPath("pgbench")
			if err != nil {
				matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
				if len(matches) == 0 {
					b.Fatal("pgbench not found on PATH or in /usr/lib/postgresql/*/bin")
				}
				pgbench = matches[len(matches)-1]
			}
			out, err := exec.Command(pgbench, "-n", "-c", "8", "-j", "2", "-t", fmt.Sprint(n/8), "-f", script, os.Getenv("TIDEMARK_PG_DSN")).CombinedOutput()
			if err != nil {
				b.Fatalf("pgbench: %v\n%s", err, out)
			}
			var tps float64
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "tps = ") {
					fmt.Sscanf(line, "tps = %f", &tps)
				}
			}
			if tps == 0 {
				b.Fatalf("no tps in pgbench's output:\n%s", out)
			}
			b.ReportMetric(tps, "records/s")
		}
	})
	for _, mode := range inboxBenchModes {
		name := mode.name
		b.Run(name, func(b *testing.B) {
			for range b.N {
				pool := inboxDB(b)
				topic := bed.Topic(b, partitions)
				group := bed.Group(b)
				bed.Produce(b, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%5000) })
				s := inboxStore(b, pool, group, mode.opts...)
				var first atomic.Int64
				hook := s.AssignHook()
				src, err := franz.New(bed.Kafka(b), group, []string{topic}, franz.Logger(kafkatest.Logger(b)))
				if err != nil {
					b.Fatal(err)
				}
				r, err := runner.New(src, runner.Handle(topic, s.Handler(inboxEffect("bench"))), runner.Concurrency(256),
					runner.Logger(kafkatest.Logger(b)), runner.OnAssign(func(ctx context.Context, as []runner.Assignment) ([]runner.Applied, error) {
						first.CompareAndSwap(0, time.Now().UnixNano())
						return hook(ctx, as)
					}))
				if err != nil {
					b.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(context.Background()) }()
				for inboxCount(b, pool, "SELECT count(*) FROM effects") < n {
					time.Sleep(20 * time.Millisecond)
				}
				took := time.Since(time.Unix(0, first.Load()))
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				if err := r.Shutdown(ctx); err != nil {
					b.Error(err)
				}
				cancel()
				<-done
				b.ReportMetric(n/took.Seconds(), "records/s")
				b.Logf("%s: %d records in %v; %+v", name, n, took.Round(time.Millisecond), s.Stats())
			}
		})
	}
}
