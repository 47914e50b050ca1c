//go:build integration

package integration_test

// A COMMIT whose outcome the client does not learn: the connection breaks
// after PostgreSQL received it (and committed, or not), or PostgreSQL waits
// for a synchronous standby that never answers. The inbox must find out
// what happened before it reports a failure — a record reported failed
// although it was applied is dead-lettered or skipped under those
// policies, and a redriven dead letter is applied twice — and when it
// cannot, say "unknown", which the runner retries and never gives up.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

// pgCut is a loopback TCP proxy in front of the bed's PostgreSQL that reads
// the protocol's message framing and can cut one connection at its next
// COMMIT: before the COMMIT reaches the server (the transaction rolls
// back), or after the server answered it (it committed; the client never
// hears so).
type pgCut struct {
	ln     net.Listener
	target string
	armed  atomic.Int32 // cutNone, cutBefore or cutAfter: for the next COMMIT
	cuts   atomic.Int32 // COMMITs cut so far
	// dropCancels drops cancel requests (the connection pgx opens to
	// cancel a query when its ctx ends), as a network that lost the
	// server would.
	dropCancels atomic.Bool
	// atCrash runs, for cutCrash, while the COMMIT is held: it is never
	// sent, and the connection is cut once atCrash returned.
	atCrash func()
	wg      sync.WaitGroup
}

const (
	cutNone int32 = iota
	cutBefore
	cutAfter
	cutCrash
)

func newPGCut(t *testing.T) *pgCut {
	t.Helper()
	u, err := url.Parse(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil || u.Host == "" {
		t.Fatalf("TIDEMARK_PG_DSN must be a postgres:// URL with a host: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgCut{ln: ln, target: u.Host}
	p.wg.Go(p.accept)
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

// dsn is TIDEMARK_PG_DSN through the proxy, with the given search_path.
func (p *pgCut) dsn(t *testing.T, searchPath string) string {
	t.Helper()
	u, _ := url.Parse(os.Getenv("TIDEMARK_PG_DSN"))
	u.Host = p.ln.Addr().String()
	q := u.Query()
	q.Set("search_path", searchPath)
	u.RawQuery = q.Encode()
	return u.String()
}

func (p *pgCut) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c, s) })
	}
}

// pgMessage reads one framed message: type byte, then a length that counts
// itself. The startup message has no type byte (typed false).
func pgMessage(r io.Reader, typed bool) (byte, []byte, error) {
	var typ [1]byte
	if typed {
		if _, err := io.ReadFull(r, typ[:]); err != nil {
			return 0, nil, err
		}
	}
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(n[:])-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	var raw bytes.Buffer
	if typed {
		raw.WriteByte(typ[0])
	}
	raw.Write(n[:])
	raw.Write(body)
	return typ[0], raw.Bytes(), nil
}

// isCommitText reports whether a statement's text is COMMIT.
func isCommitText(text []byte) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(string(text))), "commit")
}

// pgCommitWatch tells, for one connection's client messages, which one runs
// COMMIT: a simple Query, or the Bind of a statement whose Parse (maybe
// earlier, pgx prepares statements once per connection) was COMMIT.
type pgCommitWatch struct{ prepared map[string]bool }

func (w *pgCommitWatch) isCommit(typ byte, raw []byte) bool {
	body := raw[5:]
	switch typ {
	case 'Q':
		return isCommitText(body)
	case 'P':
		name, rest, _ := bytes.Cut(body, []byte{0})
		if w.prepared == nil {
			w.prepared = map[string]bool{}
		}
		w.prepared[string(name)] = isCommitText(rest)
	case 'B':
		_, rest, _ := bytes.Cut(body, []byte{0}) // the portal
		stmt, _, _ := bytes.Cut(rest, []byte{0})
		return w.prepared[string(stmt)]
	}
	return false
}

func (p *pgCut) serve(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	var swallow atomic.Bool // drop the server's answer, then cut
	cut := make(chan struct{})
	var cutOnce sync.Once
	done := func() { cutOnce.Do(func() { close(cut); c.Close(); s.Close() }) }
	go func() {
		defer done()
		for {
			typ, raw, err := pgMessage(s, true)
			if err != nil {
				return
			}
			if swallow.Load() {
				if typ == 'Z' { // ReadyForQuery: the server is done with the COMMIT
					return
				}
				continue
			}
			if _, err := c.Write(raw); err != nil {
				return
			}
		}
	}()
	_, raw, err := pgMessage(c, false) // startup, or a cancel request
	if err != nil {
		return
	}
	if len(raw) >= 8 && binary.BigEndian.Uint32(raw[4:8]) == 80877102 && p.dropCancels.Load() {
		return
	}
	if _, err := s.Write(raw); err != nil {
		return
	}
	var w pgCommitWatch
	for {
		typ, raw, err := pgMessage(c, true)
		if err != nil {
			done()
			return
		}
		if w.isCommit(typ, raw) {
			switch p.armed.Swap(cutNone) {
			case cutBefore:
				p.cuts.Add(1)
				done()
				return
			case cutCrash:
				p.cuts.Add(1)
				p.atCrash()
				done()
				return
			case cutAfter:
				p.cuts.Add(1)
				swallow.Store(true)
				if _, err := s.Write(raw); err != nil {
					done()
					return
				}
				// The rest of an extended-protocol pipeline (Execute, Sync).
				go func() { _, _ = io.Copy(s, c) }()
				<-cut
				return
			}
		}
		if _, err := s.Write(raw); err != nil {
			done()
			return
		}
	}
}

// TestInboxCommitAnswerLost cuts the TCP connection between the Store and
// PostgreSQL at a record's COMMIT, in both modes:
//
//   - after PostgreSQL committed it (the answer is lost): the handler
//     learns from another connection that the transaction committed and
//     returns nil, the record applied once — before, it returned an error,
//     which under DeadLetter or Skip gave an applied record up;
//   - before the COMMIT reached PostgreSQL: the handler learns the
//     transaction rolled back and returns an ordinary error (not "unknown"),
//     and the next attempt applies the record once.
func TestInboxCommitAnswerLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		batch  int
		queued bool
	}{{"one per transaction", 1, false}, {"batch", 8, false}, {"queued, one per transaction", 1, true}, {"queued batch", 8, true}} {
		batch := tc.batch
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			home := inboxDB(t)
			p := newPGCut(t)
			pool, err := pgxpool.New(ctx, p.dsn(t, home.Config().ConnConfig.RuntimeParams["search_path"]))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s := inboxStore(t, pool, "g", inbox.Batch(batch))
			inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
			h := s.Handler(inboxEffect("a"))
			if tc.queued {
				h = s.QueuedHandler(inboxQueuedEffect("a"))
			}
			// Once through, so that pgx has prepared the statements (the
			// proxy then sees the COMMIT's Bind).
			if err := h(ctx, inboxRec("t", 0, 0)); err != nil {
				t.Fatal(err)
			}

			p.armed.Store(cutAfter)
			if err := h(ctx, inboxRec("t", 0, 1)); err != nil {
				t.Fatalf("a record whose COMMIT committed but whose answer was lost: %v, want nil", err)
			}
			if p.cuts.Load() != 1 {
				t.Fatal("the proxy cut no COMMIT")
			}
			if n := inboxCount(t, home, `SELECT count(*) FROM effects WHERE "offset" = 1`); n != 1 {
				t.Fatalf("%d effects of record 1, want 1", n)
			}
			if err := h(ctx, inboxRec("t", 0, 1)); err != nil { // the runner's next attempt, if it made one
				t.Fatal(err)
			}

			p.armed.Store(cutBefore)
			err = h(ctx, inboxRec("t", 0, 2))
			if err == nil || errors.Is(err, runner.ErrOutcomeUnknown) {
				t.Fatalf("a record whose COMMIT never reached PostgreSQL: %v, want an error that is not ErrOutcomeUnknown", err)
			}
			if n := inboxCount(t, home, `SELECT count(*) FROM effects WHERE "offset" = 2`); n != 0 {
				t.Fatalf("%d effects of the rolled back record 2", n)
			}
			if err := h(ctx, inboxRec("t", 0, 2)); err != nil {
				t.Fatalf("record 2 again: %v", err)
			}
			if n := inboxCount(t, home, "SELECT count(*) FROM effects"); n != 3 {
				t.Fatalf("%d effects, want 3", n)
			}
		})
	}
}

// alterSystem sets a server setting with ALTER SYSTEM (RESET for an empty
// value) and tells the server to reload its configuration; each session
// rereads it before its next statement.
func alterSystem(t *testing.T, pool *pgxpool.Pool, name, value string) {
	t.Helper()
	ctx := context.Background()
	q := "ALTER SYSTEM RESET " + name
	if value != "" {
		q = "ALTER SYSTEM SET " + name + " = '" + value + "'"
	}
	if _, err := pool.Exec(ctx, q); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
}

// TestInboxSyncStandbyNeverAnswers: synchronous_standby_names names a
// standby that does not exist, so a COMMIT in a session with
// synchronous_commit = on waits forever (committed locally, not yet
// acknowledged; every other session of the bed has synchronous_commit off
// and is not affected). The attempt ends at the runner's HandlerTimeout.
// pgx then closes the connection and sends a cancel request, which would
// end the wait (PostgreSQL keeps the local commit); here it is lost, as
// in a network partition (the Store reaches PostgreSQL through a proxy
// that drops cancel requests), so the transaction stays in progress for
// pg_xact_status, and the handler says the outcome is unknown
// (runner.ErrOutcomeUnknown). The runner — with DeadLetter after one
// attempt — keeps retrying instead of dead-lettering a record that may be
// applied. When the standby setting is cleared the commit completes, the
// next attempt finds it committed, and the record is done: applied once,
// never dead-lettered. It changes a server setting, so make test runs it
// in its serial phase.
func TestInboxSyncStandbyNeverAnswers(t *testing.T) {
	ctx := context.Background()
	home := inboxDB(t)
	var pool *pgxpool.Pool
	setStandby := func(names string) {
		t.Helper()
		alterSystem(t, home, "synchronous_standby_names", names)
		// Every session rereads the configuration before its next
		// statement once it got the postmaster's signal: wait until each
		// connection the Store may use has.
		var conns []*pgxpool.Conn
		defer func() {
			for _, c := range conns {
				c.Release()
			}
		}()
		for _, p := range []*pgxpool.Pool{home, pool} {
			if p == nil {
				continue
			}
			for range p.Config().MaxConns {
				c, err := p.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				inboxWaitFor(t, "the reload", func() bool {
					var got string
					_ = c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&got)
					return got == names
				})
			}
		}
	}
	t.Cleanup(func() { pool = nil; setStandby("") })
	proxy := newPGCut(t)
	proxy.dropCancels.Store(true)
	cfg, err := pgxpool.ParseConfig(proxy.dsn(t, home.Config().ConnConfig.RuntimeParams["search_path"]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	cfg.MaxConns = 4
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := inboxStore(t, pool, "g", inbox.InDoubtTimeout(300*time.Millisecond))
	// First a handler whose ctx ends during the wait, with the cancel
	// request reaching the server: PostgreSQL ends the wait and keeps the
	// local commit, and the handler finds the transaction committed.
	direct := inboxStore(t, inboxPoolOn(t, 2, map[string]string{
		"search_path":        home.Config().ConnConfig.RuntimeParams["search_path"],
		"synchronous_commit": "on",
	}), "g2", inbox.InDoubtTimeout(5*time.Second))
	inboxTake(t, direct, runner.TP{Topic: "t", Partition: 1}, -1)

	src := runnertest.New()
	d := &dlqRecorder{}
	var attempts, unknown atomic.Int32
	h := s.Handler(inboxEffect("a"))
	r, err := runner.New(src, runner.Handle("t", func(ctx context.Context, rec runner.Record) error {
		attempts.Add(1)
		err := h(ctx, rec)
		if errors.Is(err, runner.ErrOutcomeUnknown) {
			unknown.Add(1)
		}
		return err
	}), runner.OnAssign(s.AssignHook()), runner.Failure(runner.DeadLetter("t.dlq", 1, d)),
		runner.HandlerTimeout(500*time.Millisecond), runner.Backoff(50*time.Millisecond, 200*time.Millisecond),
		runner.CommitInterval(20*time.Millisecond), runner.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		r.Close()
		<-done
	}()
	// The lease first: its bump commits with synchronous_commit on too,
	// and would wait for the standby like any commit.
	if err := src.Assign(ctx, runner.TP{Topic: "t", Partition: 0}); err != nil {
		t.Fatal(err)
	}
	setStandby("tidemark_no_such_standby")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = direct.Handler(inboxEffect("direct"))(cctx, inboxRec("t", 1, 100))
	cancel()
	if err != nil {
		t.Fatalf("a COMMIT whose wait for the standby was cancelled: %v, want nil (committed locally)", err)
	}
	if n := inboxCount(t, home, `SELECT count(*) FROM effects WHERE owner = 'direct'`); n != 1 {
		t.Fatalf("%d effects of the cancelled wait's record, want 1", n)
	}
	src.Append(inboxRec("t", 0, 0))
	inboxWaitFor(t, "three attempts of unknown outcome", func() bool { return unknown.Load() >= 3 })
	if d.count() != 0 {
		t.Fatalf("a record of unknown outcome was dead-lettered after %d attempts", attempts.Load())
	}
	if off, ok := src.Committed(runner.TP{Topic: "t", Partition: 0}); ok && off > 0 {
		t.Fatalf("committed %d past a record of unknown outcome", off)
	}
	setStandby("")
	inboxWaitFor(t, "the record done", func() bool {
		off, ok := src.Committed(runner.TP{Topic: "t", Partition: 0})
		return ok && off == 1
	})
	if d.count() != 0 {
		t.Fatal("the record was dead-lettered")
	}
	if n := inboxCount(t, home, "SELECT count(*) FROM effects WHERE owner = 'a'"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	t.Logf("%d attempts, %d of unknown outcome", attempts.Load(), unknown.Load())
}

// dlqRecorder is a dead-letter writer that counts what it is given.
type dlqRecorder struct {
	mu  sync.Mutex
	got []runner.Record
}

func (d *dlqRecorder) WriteDeadLetter(_ context.Context, _ string, rec runner.Record) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, rec)
	return nil
}

func (d *dlqRecorder) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.got)
}

// TestInboxCommitXIDReusedAfterCrash: PostgreSQL crashes (an immediate
// shutdown, as a kill -9 of the server would) while a record's COMMIT is
// on its way, before the transaction's WAL reached the disk. The
// transaction is gone, and so is every trace of its id: crash recovery
// sets the next transaction id from the WAL it has, so the first
// transactions after the restart are given the same ids again. One of
// them commits, and pg_xact_status of the lost transaction's id then
// says "committed" — of another transaction. The chaos suite lost two
// records that way (seed 1796129993360595311: two consumers' COMMITs in
// doubt across a PostgreSQL crash, both "committed", neither applied).
// The handler must not take pg_xact_status's word alone: the record's
// inbox row, written in the same transaction, is what tells. It restarts
// the bed's PostgreSQL, so make test runs it in its serial phase.
func TestInboxCommitXIDReusedAfterCrash(t *testing.T) {
	ctx := context.Background()
	script, err := filepath.Abs("../scripts/testbed")
	if err != nil {
		t.Fatal(err)
	}
	home := inboxDB(t)
	// The WAL writer writes the WAL every wal_writer_delay; with it at
	// its maximum, 10 s, nothing writes the lost transaction's WAL before
	// the crash (nothing else commits meanwhile: the serial phase runs
	// this test alone).
	alterSystem(t, home, "wal_writer_delay", "10s")
	t.Cleanup(func() { alterSystem(t, home, "wal_writer_delay", "") })

	p := newPGCut(t)
	pool, err := pgxpool.New(ctx, p.dsn(t, home.Config().ConnConfig.RuntimeParams["search_path"]))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := inboxStore(t, pool, "g", inbox.InDoubtTimeout(time.Minute))
	inboxTake(t, s, runner.TP{Topic: "t", Partition: 0}, -1)
	var xid atomic.Int64 // the id of the last transaction the effect ran in
	effect := inboxEffect("a")
	h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		var x int64
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			return err
		}
		xid.Store(x)
		return effect(ctx, tx, rec)
	})
	// Once through, so that pgx has prepared the statements (the proxy
	// then sees the COMMIT's Bind).
	if err := h(ctx, inboxRec("t", 0, 0)); err != nil {
		t.Fatal(err)
	}
	// The bed commits asynchronously (synchronous_commit off): write
	// what the test set up to the disk, or the crash forgets it too.
	if _, err := home.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}

	// At the COMMIT of record 1: crash and restart PostgreSQL, then run
	// transactions until one is given the lost transaction's id.
	var reused []int64
	p.atCrash = func() {
		if out, err := exec.Command(script, "restart", "postgres", "--kill").CombinedOutput(); err != nil {
			t.Errorf("scripts/testbed restart postgres --kill: %v\n%s", err, out)
			return
		}
		// The crash broke the test's own connections: a pool hands out
		// an idle one without checking it.
		home.Reset()
		conn, err := pgx.Connect(ctx, os.Getenv("TIDEMARK_PG_DSN"))
		if err != nil {
			t.Errorf("connecting after the restart: %v", err)
			return
		}
		defer conn.Close(ctx)
		for range 1000 {
			var x int64
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x)
			})
			if err != nil {
				t.Errorf("a transaction after the restart: %v", err)
				return
			}
			reused = append(reused, x)
			if x >= xid.Load() {
				return
			}
		}
	}
	p.armed.Store(cutCrash)
	err = h(ctx, inboxRec("t", 0, 1))
	if t.Failed() {
		t.FailNow()
	}
	lost := xid.Load()
	if !slices.Contains(reused, lost) {
		t.Fatalf("the test's premise failed: the lost transaction's id %d was not given again after the crash (ids after it: %v); "+
			"its WAL reached the disk before the crash", lost, reused)
	}
	if n := inboxCount(t, home, `SELECT count(*) FROM effects WHERE "offset" = 1`); n != 0 {
		t.Fatalf("%d effects of record 1, whose transaction the crash rolled back", n)
	}
	if err == nil || errors.Is(err, runner.ErrOutcomeUnknown) {
		t.Fatalf("a record whose transaction the crash rolled back, its id %d since committed by another transaction: %v, "+
			"want an error that is not ErrOutcomeUnknown (nil reports it applied: it would be lost)", lost, err)
	}
	if err := h(ctx, inboxRec("t", 0, 1)); err != nil {
		t.Fatalf("record 1 again: %v", err)
	}
	if n := inboxCount(t, home, `SELECT count(*) FROM effects WHERE "offset" = 1`); n != 1 {
		t.Fatalf("%d effects of record 1, want 1", n)
	}
}
