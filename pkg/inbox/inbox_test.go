package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// nowhere is a pool on an address nothing listens on. pgxpool connects
// lazily, so a test that never reaches the database can use it; one that
// does gets an error at once.
func nowhere(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestNewValidates(t *testing.T) {
	pool := nowhere(t)
	tests := []struct {
		name   string
		pool   *pgxpool.Pool
		group  string
		opts   []inbox.Option
		option string // the ConfigError's Option; "" means valid
	}{
		{"valid", pool, "g", nil, ""},
		{"all options", pool, "g", []inbox.Option{inbox.Schema("s"), inbox.Owner("o"), inbox.DedupHeader("message-id"),
			inbox.ReplayLimit(0), inbox.Batch(64), inbox.BatchWait(time.Millisecond), inbox.Retries(1),
			inbox.TxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable}), inbox.RetainRecords(0), inbox.RetainFor(time.Hour),
			inbox.DedupWindow(time.Hour), inbox.PruneBatch(1), inbox.InDoubtTimeout(time.Second), inbox.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))), inbox.MeterProvider(nil)}, ""},
		{"nil pool", nil, "g", nil, "pool"},
		{"empty group", pool, "", nil, "group"},
		{"empty schema", pool, "g", []inbox.Option{inbox.Schema("")}, "Schema"},
		{"empty owner", pool, "g", []inbox.Option{inbox.Owner("")}, "Owner"},
		{"nil dedup func", pool, "g", []inbox.Option{inbox.DedupKey(nil)}, "DedupKey"},
		{"empty header", pool, "g", []inbox.Option{inbox.DedupHeader("")}, "DedupHeader"},
		{"negative replay limit", pool, "g", []inbox.Option{inbox.ReplayLimit(-1)}, "ReplayLimit"},
		{"batch 0", pool, "g", []inbox.Option{inbox.Batch(0)}, "Batch"},
		{"migrate to 0", pool, "g", []inbox.Option{inbox.MigrateTo(0)}, "MigrateTo"},
		{"migrate past this build", pool, "g", []inbox.Option{inbox.MigrateTo(inbox.SchemaVersion + 1)}, "MigrateTo"},
		{"batch 65", pool, "g", []inbox.Option{inbox.Batch(65)}, "Batch"},
		{"negative batch wait", pool, "g", []inbox.Option{inbox.BatchWait(-time.Second)}, "BatchWait"},
		{"retries 0", pool, "g", []inbox.Option{inbox.Retries(0)}, "Retries"},
		{"negative margin", pool, "g", []inbox.Option{inbox.RetainRecords(-1)}, "RetainRecords"},
		{"negative age", pool, "g", []inbox.Option{inbox.RetainFor(-time.Second)}, "RetainFor"},
		{"zero dedup window", pool, "g", []inbox.Option{inbox.DedupWindow(0)}, "DedupWindow"},
		{"zero prune batch", pool, "g", []inbox.Option{inbox.PruneBatch(0)}, "PruneBatch"},
		{"zero in-doubt timeout", pool, "g", []inbox.Option{inbox.InDoubtTimeout(0)}, "InDoubtTimeout"},
		{"nil logger", pool, "g", []inbox.Option{inbox.Logger(nil)}, "Logger"},
		{"nil coordinator", pool, "g", []inbox.Option{inbox.Owners(nil)}, "Owners"},
		{"first bad option wins", pool, "g", []inbox.Option{inbox.Owner(""), inbox.Batch(0)}, "Owner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := inbox.New(tt.pool, tt.group, tt.opts...)
			if tt.option == "" {
				if err != nil || s == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			var ce *inbox.ConfigError
			if !errors.As(err, &ce) || ce.Option != tt.option || s != nil {
				t.Fatalf("New: %v (store %v), want a ConfigError for %s", err, s, tt.option)
			}
			if !strings.HasPrefix(err.Error(), "inbox: option "+tt.option+": ") {
				t.Fatalf("message %q does not name the option", err)
			}
		})
	}
}

func TestDefaultOwnerIsUnique(t *testing.T) {
	pool := nowhere(t)
	a, _ := inbox.New(pool, "g")
	b, _ := inbox.New(pool, "g")
	if a.Owner() == "" || a.Owner() == b.Owner() {
		t.Fatalf("owners %q and %q, want two different names", a.Owner(), b.Owner())
	}
	if c, _ := inbox.New(pool, "g", inbox.Owner("pod-1")); c.Owner() != "pod-1" || c.Group() != "g" {
		t.Fatalf("Owner %q Group %q", c.Owner(), c.Group())
	}
}

// TestHandlerWithoutLease: a handler for a partition the assign hook never
// leased fails with ErrNoLease naming the record, without a database call
// (the pool points nowhere), in both modes.
func TestHandlerWithoutLease(t *testing.T) {
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			s, err := inbox.New(nowhere(t), "g", inbox.Batch(batch))
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h := s.Handler(func(context.Context, pgx.Tx, runner.Record) error { ran = true; return nil })
			err = h(context.Background(), runner.Record{Topic: "t", Partition: 2, Offset: 9})
			if !errors.Is(err, inbox.ErrNoLease) || !strings.Contains(err.Error(), "t/2@9") || ran {
				t.Fatalf("got %v (effect ran: %v), want ErrNoLease naming t/2@9", err, ran)
			}
			if errors.Is(err, runner.ErrFenced) {
				t.Fatal("ErrNoLease must not read as fenced: the runner would drop the record silently")
			}
			if _, ok := s.Epoch(runner.TP{Topic: "t", Partition: 2}); ok {
				t.Fatal("an epoch without an assignment")
			}
		})
	}
}

func TestNilEffect(t *testing.T) {
	s, _ := inbox.New(nowhere(t), "g")
	if err := s.Handler(nil)(context.Background(), runner.Record{}); err == nil {
		t.Fatal("a nil Effect must fail every record")
	}
}

// TestUnreachable: the calls that need the database say they cannot reach
// it, and do not hang.
func TestUnreachable(t *testing.T) {
	s, _ := inbox.New(nowhere(t), "g")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, call := range map[string]func() error{
		"Check":   func() error { return s.Check(ctx) },
		"Migrate": func() error { return s.Migrate(ctx) },
		"hook": func() error {
			_, err := s.AssignHook()(ctx, []runner.Assignment{{TP: runner.TP{Topic: "t"}, Start: -1}})
			return err
		},
		"Prune": func() error { _, err := s.Prune(ctx, runner.TP{Topic: "t"}, 5000); return err },
	} {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "cannot use PostgreSQL") {
			t.Errorf("%s: %v, want an error saying PostgreSQL cannot be used", name, err)
		}
	}
	if err := s.RunRetention(ctx, 0, nil); err == nil {
		t.Error("RunRetention with a zero interval must fail")
	}
}

func TestFencedError(t *testing.T) {
	cause := &pgconn.PgError{Code: "TM001", Message: "fenced"}
	tests := []struct {
		err  *inbox.FencedError
		want string
	}{
		{&inbox.FencedError{Record: "t/0@5", Epoch: 3, Current: 4}, "inbox: t/0@5 fenced: this member holds lease epoch 3, the partition's lease is at epoch 4"},
		{&inbox.FencedError{Record: "t/0@5", Epoch: 3}, "inbox: t/0@5 fenced: this member holds lease epoch 3, the partition has no lease"},
		{&inbox.FencedError{Record: "t/0", Epoch: 3, Cause: cause}, "inbox: t/0 fenced: this member holds lease epoch 3, the lease moved on before the commit"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
		wrapped := fmt.Errorf("handler: %w", tt.err)
		if !errors.Is(wrapped, runner.ErrFenced) {
			t.Errorf("%v does not unwrap to runner.ErrFenced", tt.err)
		}
		if tt.err.Cause != nil && !errors.Is(wrapped, tt.err.Cause) {
			t.Errorf("%v does not unwrap to its cause", tt.err)
		}
	}
}

func TestRetryable(t *testing.T) {
	for code, want := range map[string]bool{"40001": true, "40P01": true, "TM002": true, "23505": false, "TM001": false, "57P01": false} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		if got := inbox.Retryable(err); got != want {
			t.Errorf("retryable(%s) = %v, want %v", code, got, want)
		}
	}
	if inbox.Retryable(errors.New("connection reset")) || inbox.Retryable(nil) {
		t.Error("a non-PostgreSQL error is not retried inside the handler")
	}
}

func TestRetryBackoff(t *testing.T) {
	for attempt := 1; attempt <= 12; attempt++ {
		d := min(10*time.Millisecond<<(attempt-1), time.Second)
		for range 100 {
			if got := inbox.RetryBackoff(attempt); got < d/2 || got > d {
				t.Fatalf("attempt %d: %v not in [%v, %v]", attempt, got, d/2, d)
			}
		}
	}
}

func TestDedupHeader(t *testing.T) {
	s, _ := inbox.New(nowhere(t), "g", inbox.DedupHeader("message-id"))
	tests := []struct {
		headers []runner.Header
		want    string // "" means none
	}{
		{nil, ""},
		{[]runner.Header{{Key: "other", Value: []byte("x")}}, ""},
		{[]runner.Header{{Key: "message-id", Value: nil}}, ""},
		{[]runner.Header{{Key: "message-id", Value: []byte("m-1")}}, "m-1"},
		{[]runner.Header{{Key: "message-id", Value: []byte("m-1")}, {Key: "message-id", Value: []byte("m-2")}}, "m-2"},
	}
	for _, tt := range tests {
		rec := runner.Record{Headers: tt.headers}
		got := inbox.DedupKeyOf(s, &rec)
		switch {
		case tt.want == "" && got != nil:
			t.Errorf("%v: key %q, want none", tt.headers, *got)
		case tt.want != "" && (got == nil || *got != tt.want):
			t.Errorf("%v: key %v, want %q", tt.headers, got, tt.want)
		}
	}
	plain, _ := inbox.New(nowhere(t), "g")
	if k := inbox.DedupKeyOf(plain, &runner.Record{Headers: tests[3].headers}); k != nil {
		t.Errorf("a Store without DedupKey gave key %q", *k)
	}
}

func TestOffsetSet(t *testing.T) {
	tests := []struct {
		offs []int64
		runs int
	}{
		{nil, 0},
		{[]int64{5}, 1},
		{[]int64{1, 2, 3, 4}, 1},
		{[]int64{100, 103, 108}, 3},
		{[]int64{9, 7, 8, 8, 1, 2}, 2}, // unsorted, duplicates
		{[]int64{0, 1, 2, 50, 51, 99}, 3},
	}
	for _, tt := range tests {
		in := map[int64]bool{}
		for _, o := range tt.offs {
			in[o] = true
		}
		contains := inbox.NewOffsetSet(tt.offs)
		for off := int64(-2); off < 120; off++ {
			if got := contains(off); got != in[off] {
				t.Errorf("%v: contains(%d) = %v, want %v", tt.offs, off, got, in[off])
			}
		}
		if got := inbox.OffsetSetRuns(tt.offs); got != tt.runs {
			t.Errorf("%v: %d runs, want %d", tt.offs, got, tt.runs)
		}
	}
}

// FuzzOffsetSet checks the set against a map: every offset answers as the
// map does, and the runs are as few as the gaps allow.
func FuzzOffsetSet(f *testing.F) {
	f.Add([]byte{0, 1, 2, 10, 11, 200})
	f.Add([]byte{})
	f.Add([]byte{255, 0, 255})
	f.Fuzz(func(t *testing.T, data []byte) {
		offs := make([]int64, len(data))
		in := map[int64]bool{}
		for i, b := range data {
			offs[i] = int64(b) * 3 / 2 // some runs, some gaps
			in[offs[i]] = true
		}
		contains := inbox.NewOffsetSet(offs)
		for off := int64(-1); off <= 400; off++ {
			if contains(off) != in[off] {
				t.Fatalf("contains(%d) = %v, want %v", off, contains(off), in[off])
			}
		}
		sorted := slices.Sorted(func(yield func(int64) bool) {
			for o := range in {
				if !yield(o) {
					return
				}
			}
		})
		runs := 0
		for i, o := range sorted {
			if i == 0 || o != sorted[i-1]+1 {
				runs++
			}
		}
		if got := inbox.OffsetSetRuns(offs); got != runs {
			t.Fatalf("%d runs, want %d", got, runs)
		}
	})
}

func BenchmarkOffsetSet(b *testing.B) {
	// 100,000 applied offsets with a transaction marker every 1,000.
	var offs []int64
	for o := int64(0); len(offs) < 100_000; o++ {
		if o%1001 != 1000 {
			offs = append(offs, o)
		}
	}
	contains := inbox.NewOffsetSet(offs)
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			contains(offs[i%len(offs)])
			i += 7919
		}
	})
	b.Run("beyond", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			contains(1 << 40)
		}
	})
	b.Run("map-baseline", func(b *testing.B) {
		m := make(map[int64]struct{}, len(offs))
		for _, o := range offs {
			m[o] = struct{}{}
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = m[offs[i%len(offs)]]
			i += 7919
		}
	})
}

func TestSchemaVersion(t *testing.T) {
	if inbox.SchemaVersion != inbox.LastMigration() {
		t.Fatalf("SchemaVersion %d, last migration %d", inbox.SchemaVersion, inbox.LastMigration())
	}
}

func TestSavepoints(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range inbox.SavepointNames {
		if seen[n] {
			t.Fatalf("savepoint name %q used twice", n)
		}
		seen[n] = true
	}
	if len(inbox.SavepointNames) != 64 {
		t.Fatalf("%d savepoint names, want one per record of the largest batch (64)", len(inbox.SavepointNames))
	}
	for _, tt := range []struct {
		args []any
		want bool
	}{
		{nil, true},
		{[]any{1, "a"}, true},
		{[]any{pgx.NamedArgs{"a": 1}}, true},
		{[]any{pgx.QueryExecModeSimpleProtocol, 1}, false},
		{[]any{pgx.QueryResultFormats{pgx.BinaryFormatCode}}, false},
	} {
		if got := inbox.Pipelined(tt.args); got != tt.want {
			t.Errorf("pipelined(%v) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

func TestLockKeys(t *testing.T) {
	if inbox.LockKey("a", "bc") == inbox.LockKey("ab", "c") {
		t.Fatal("lock keys of different name lists collide")
	}
}

// TestDollarQuote: the quoted body ends only where the quote says, whatever
// tags the body holds.
func TestDollarQuote(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"SELECT 1", "$fence$SELECT 1$fence$"},
		{`FROM "x$fence$".t`, `$fence1$FROM "x$fence$".t$fence1$`},
		{`"$fence$" "$fence1$"`, `$fence2$"$fence$" "$fence1$"$fence2$`},
	} {
		if got := inbox.DollarQuote(tc.body); got != tc.want {
			t.Errorf("DollarQuote(%q) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

// TestInDoubt: which COMMIT errors leave the outcome unknown (the Store
// then asks PostgreSQL) and which say it rolled back; and what the
// handler returns when it cannot learn it.
func TestInDoubt(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"an error PostgreSQL answered", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, false},
		{"the fence", fmt.Errorf("commit: %w", &pgconn.PgError{Severity: "ERROR", Code: "TM001"}), false},
		{"the transaction had failed", pgx.ErrTxCommitRollback, false},
		{"the session ended (FATAL)", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true},
		{"the connection broke", io.ErrUnexpectedEOF, true},
		{"ctx ended", context.DeadlineExceeded, true},
		{"pgx's conn closed, marked safe to retry although the COMMIT was sent", pgconn.ErrConnClosed, true},
	}
	for _, tt := range tests {
		if got := inbox.InDoubt(tt.err); got != tt.want {
			t.Errorf("%s: in doubt = %v, want %v", tt.name, got, tt.want)
		}
	}
	err := fmt.Errorf("handler: %w", &inbox.InDoubtError{Record: "t/0@5", XID: 42, Cause: io.ErrUnexpectedEOF})
	if !errors.Is(err, runner.ErrOutcomeUnknown) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("%v does not unwrap to runner.ErrOutcomeUnknown and its cause", err)
	}
	if !strings.Contains(err.Error(), "t/0@5") || !strings.Contains(err.Error(), "42") {
		t.Errorf("%q does not name the record and the transaction", err)
	}
}

// checkFilter checks the assign hook's filter of s for a partition with
// applied offsets 5 and 6 and the applied mark 3: with protection, 1 (below
// the mark), 5 and 6 are skipped and 4 and 7 are not; without, there is no
// filter.
func checkFilter(t *testing.T, s *inbox.Store, protected bool) {
	t.Helper()
	f := inbox.AppliedFilter(s, runner.TP{Topic: "t", Partition: 0}, []int64{5, 6}, 3)
	if !protected {
		if f != nil {
			t.Error("without replay protection the assign hook returned a filter")
		}
		return
	}
	if f == nil {
		t.Fatal("the assign hook returned no filter for a partition with applied offsets")
	}
	for off, want := range map[int64]bool{1: true, 4: false, 5: true, 6: true, 7: false} {
		if got := f(off); got != want {
			t.Errorf("filter(%d) = %v, want %v", off, got, want)
		}
	}
}

// quiet is a Logger option that drops the Store's log.
var quiet = inbox.Logger(slog.New(slog.NewTextHandler(io.Discard, nil)))
