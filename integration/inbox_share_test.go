//go:build integration

package integration_test

// The inbox over a share group (inbox.ShareGroup, docs/inbox.md "Over a
// share group") on the real Kafka 4.4 broker: three consumer processes
// (this test binary, run again as TestInboxShareHelperProcess) in one
// share group, on one partition and on several, killed with SIGKILL,
// frozen with SIGSTOP past the lock, stopped with SIGTERM, and fed a
// poison record. Every record's effect must be applied exactly once.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

const inboxShareChildEnv = "TIDEMARK_INBOX_SHARE_CHILD"

// inboxShareSpec is what a child process is told.
type inboxShareSpec struct {
	Topic, Group, Schema, Owner string
	Delay                       time.Duration // per record, inside the transaction, after the effect
	Poison                      string        // the value whose effect always fails ("": none)
	DLQ                         string        // the broker's dead-letter topic ("": none)
	Sessions, Poll, Concurrency int
	Crash                       bool // the poison record kills the process (exit 7) instead of failing
	DeliveryLimit               int  // share.delivery.count.limit (0: the broker's)
}

// TestInboxShareHelperProcess is the consumer process the share inbox tests
// start. Without TIDEMARK_INBOX_SHARE_CHILD it returns at once. It applies
// inboxEffect with the record's delivery count in the owner column
// ("c1 d2": process c1, second delivery), rejects the poison record after
// three attempts (Skip(3)), stops on SIGTERM within 15 s, and prints its
// Store's Stats as one line "inbox-share-stats {json}" when it stops.
func TestInboxShareHelperProcess(t *testing.T) {
	raw := os.Getenv(inboxShareChildEnv)
	if raw == "" {
		return
	}
	var sp inboxShareSpec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		t.Fatalf("%s: %v", inboxShareChildEnv, err)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = sp.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "inbox-share-" + sp.Owner
	// What docs/inbox.md tells users to set: a frozen process's open
	// transactions (and the inbox rows they hold locked) end after 2 s,
	// instead of stalling the other members' claims of those records —
	// and with them the others' whole sessions — until it wakes.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "2000"
	cfg.MaxConns = int32(sp.Concurrency) + 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := inboxStore(t, pool, sp.Group, inbox.ShareGroup(), inbox.Owner(sp.Owner))
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	sopts := append(shareGroupOpts(), share.Sessions(sp.Sessions), share.MaxPollRecords(sp.Poll),
		share.Logger(kafkatest.Logger(t)))
	if sp.DLQ != "" {
		sopts = append(sopts, share.GroupConfig("errors.deadletterqueue.topic.name", sp.DLQ))
	}
	if sp.DeliveryLimit > 0 {
		sopts = append(sopts, share.GroupConfig("share.delivery.count.limit", strconv.Itoa(sp.DeliveryLimit)))
	}
	src, err := share.New(bed.Kafka(t), sp.Group, []string{sp.Topic}, sopts...)
	if err != nil {
		t.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if sp.Poison != "" && string(rec.Value) == sp.Poison {
			if sp.Crash {
				fmt.Printf("poison record %s at delivery count %d: exiting\n", rec.String(), rec.DeliveryCount)
				os.Exit(7)
			}
			return errors.New("poison record")
		}
		// The effect first, then the delay: a process killed in the delay
		// has written its effect in a transaction that never commits.
		if err := inboxEffect(fmt.Sprintf("%s d%d", sp.Owner, rec.DeliveryCount))(ctx, tx, rec); err != nil {
			return err
		}
		select {
		case <-time.After(sp.Delay):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r, err := runner.New(src, runner.Handle(sp.Topic, s.Handler(effect)),
		runner.Concurrency(sp.Concurrency), runner.Failure(runner.Skip(3)),
		runner.Backoff(20*time.Millisecond, 100*time.Millisecond), runner.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	runUntilSIGTERM(t, ctx, r)
	b, _ := json.Marshal(s.Stats())
	fmt.Printf("inbox-share-stats %s\n", b)
}

// shareChild is one consumer process.
type shareChild struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

// inboxShareFleet is a test's topic, group, schema and processes.
type inboxShareFleet struct {
	t    *testing.T
	pool *pgxpool.Pool
	spec inboxShareSpec
	logs string
	n    int
	kids []*shareChild
}

func newInboxShareFleet(t *testing.T, partitions, n int, spec inboxShareSpec) *inboxShareFleet {
	t.Helper()
	pool := inboxDB(t)
	spec.Topic = bed.Topic(t, partitions)
	spec.Group = bed.Name(t, "share")
	spec.Schema = pool.Config().ConnConfig.RuntimeParams["search_path"]
	f := &inboxShareFleet{t: t, pool: pool, spec: spec, logs: t.TempDir(), n: n}
	bed.Produce(t, spec.Topic, n, func(i int) string { return "k" + strconv.Itoa(i%16) })
	t.Cleanup(func() {
		for _, c := range f.kids {
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			// The logs' directory goes with the test: their ends here.
			for _, c := range f.kids {
				b, _ := os.ReadFile(c.log)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("process %s, the last lines of its log:\n%s", c.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	})
	return f
}

// start starts a consumer process named name.
func (f *inboxShareFleet) start(name string) *shareChild {
	f.t.Helper()
	sp := f.spec
	sp.Owner = name
	raw, _ := json.Marshal(sp)
	cmd := exec.Command(os.Args[0], "-test.run=^TestInboxShareHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), inboxShareChildEnv+"="+string(raw))
	log := filepath.Join(f.logs, name+".log")
	out, err := os.Create(log)
	if err != nil {
		f.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	c := &shareChild{name: name, cmd: cmd, log: log, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait(); out.Close() }()
	f.kids = append(f.kids, c)
	return c
}

// effects counts effect rows matching where.
func (f *inboxShareFleet) effects(where string, args ...any) int64 {
	return inboxCount(f.t, f.pool, "SELECT count(*) FROM effects WHERE "+where, args...)
}

// waitEffects waits until at least want effects are in.
func (f *inboxShareFleet) waitEffects(want int64, within time.Duration) {
	f.t.Helper()
	kafkatest.WaitFor(f.t, within, fmt.Sprintf("%d effects", want), func() bool { return f.effects("true") >= want })
}

// openTx counts the transactions process name has open in PostgreSQL:
// records it claimed and has not committed.
func (f *inboxShareFleet) openTx(name string) int64 {
	return inboxCount(f.t, f.pool, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, "inbox-share-"+name)
}

// stop sends SIGTERM to c and waits for it to exit; it returns the Stats
// line it printed.
func (f *inboxShareFleet) stop(c *shareChild, within time.Duration) inbox.Stats {
	f.t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		c.done <- err // for the cleanup
		if err != nil {
			f.t.Fatalf("process %s: %v (log %s)", c.name, err, c.log)
		}
	case <-time.After(within):
		f.t.Fatalf("process %s did not stop within %v of SIGTERM (log %s)", c.name, within, c.log)
	}
	return childStats(f.t, c)
}

func childStats(t *testing.T, c *shareChild) inbox.Stats {
	t.Helper()
	fh, err := os.Open(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "inbox-share-stats "); ok {
			var st inbox.Stats
			if err := json.Unmarshal([]byte(rest), &st); err != nil {
				t.Fatalf("%s stats %q: %v", c.name, rest, err)
			}
			return st
		}
	}
	t.Fatalf("process %s printed no stats (log %s)", c.name, c.log)
	return inbox.Stats{}
}

// exactlyOnce checks that every one of want records has exactly one effect
// row and one inbox row, waiting up to within for the last ones.
func (f *inboxShareFleet) exactlyOnce(want int, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for f.effects("true") < int64(want) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	// Redeliveries that are still on their way would come within a lock
	// or two; a duplicate effect would show up here.
	time.Sleep(2 * shareLock)
	inboxExactlyOnceNoOrder(f.t, f.pool, want)
}

func inboxSharePartitions(t *testing.T, body func(t *testing.T, partitions int)) {
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("partitions=%d", p), func(t *testing.T) { body(t, p) })
	}
}

// TestInboxShareKill9: three processes, one killed with SIGKILL while it
// holds records (its transactions open): the records it had acquired come
// back to the others — at delivery count 2 if its transaction had not
// committed, as a replay (counted) if it had and its accept had not reached
// the broker — and every effect is applied exactly once.
func TestInboxShareKill9(t *testing.T) {
	t.Parallel()
	inboxSharePartitions(t, func(t *testing.T, partitions int) {
		const n = 600
		f := newInboxShareFleet(t, partitions, n, inboxShareSpec{Delay: 100 * time.Millisecond,
			Sessions: 2, Poll: 4, Concurrency: 8})
		a, b, c := f.start("c1"), f.start("c2"), f.start("c3")
		f.waitEffects(n/4, 2*time.Minute)
		kafkatest.WaitFor(t, 10*time.Second, "c1 inside a transaction", func() bool {
			return f.effects("owner LIKE 'c1 %'") > 0 && f.openTx("c1") > 0
		})
		before := f.effects("owner LIKE 'c1 %'")
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-a.done
		a.done <- nil
		f.exactlyOnce(n, 2*time.Minute)
		redelivered := f.effects("owner NOT LIKE '% d1'")
		sb, sc := f.stop(b, 30*time.Second), f.stop(c, 30*time.Second)
		t.Logf("c1 applied %d before its kill; %d effects applied at delivery count >= 2; survivors' replays %d+%d",
			before, redelivered, sb.Replays, sc.Replays)
		// c1's acquired records came back to the others either way: not
		// committed by c1 (applied at delivery count 2), or committed and
		// not yet acknowledged (a replay).
		if redelivered+sb.Replays+sc.Replays == 0 {
			t.Fatalf("no record was applied at a delivery count above 1 and no replay was counted: the kill took no acquired record with it, the test did not exercise a redelivery")
		}
	})
}

// TestInboxShareSIGSTOP: three processes; one is frozen with SIGSTOP past
// the lock duration while it holds records it has not started (waiting for
// a worker) and records inside open transactions (which PostgreSQL ends
// after idle_in_transaction_session_timeout). The broker gives them to the
// others, who apply them; woken, the frozen process runs its waiting
// records anyway, and each of those late runs finds the row: a replay,
// counted in its Stats. Every effect is applied once.
func TestInboxShareSIGSTOP(t *testing.T) {
	t.Parallel()
	inboxSharePartitions(t, func(t *testing.T, partitions int) {
		const n = 400
		// One session taking 16 records a poll, two workers: 14 records
		// of a poll wait for a worker at any time.
		f := newInboxShareFleet(t, partitions, n, inboxShareSpec{Delay: 150 * time.Millisecond,
			Sessions: 1, Poll: 16, Concurrency: 2})
		// c1 alone first: started with the others, it can find their
		// sessions holding every partition (the broker's assignor gives
		// each of three members one of three partitions, and moves them
		// as members join) and the records drained before it applies
		// any, and there would be nothing to freeze it with.
		a := f.start("c1")
		if !kafkatest.Eventually(2*time.Minute, func() bool { return f.effects("owner LIKE 'c1 %'") >= 4 }) {
			t.Fatalf("c1 applied %d effects in 2m0s, want 4 before it is frozen", f.effects("owner LIKE 'c1 %'"))
		}
		b, c := f.start("c2"), f.start("c3")
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// Frozen for at least three lock durations, and until the others
		// applied records c1 held (at delivery count 2).
		frozen := time.Now()
		kafkatest.WaitFor(t, time.Minute, "the others applying records c1 held", func() bool {
			return time.Since(frozen) >= 3*shareLock && f.effects("owner NOT LIKE 'c1 %' AND owner NOT LIKE '% d1'") > 0
		})
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		f.exactlyOnce(n, 2*time.Minute)
		sa := f.stop(a, 30*time.Second)
		sb, sc := f.stop(b, 30*time.Second), f.stop(c, 30*time.Second)
		t.Logf("woken c1: applied %d, replays %d; c2 replays %d, c3 replays %d", sa.Applied, sa.Replays, sb.Replays, sc.Replays)
		if sa.Replays == 0 {
			t.Fatalf("the woken process counted no replay: its late runs of the records the others took were not dedup'd by the inbox (stats %+v)", sa)
		}
		inboxExactlyOnceNoOrder(t, f.pool, n)
	})
}

// TestInboxShareSIGTERMAndPoison: three processes, one stopped with SIGTERM
// midway (it finishes or releases what it holds, accepts nothing it did not
// apply), and one poison record: tried three times, rejected, and written by
// the broker to the group's dead-letter topic; it has no effect and no
// inbox row. Every other record is applied exactly once.
func TestInboxShareSIGTERMAndPoison(t *testing.T) {
	t.Parallel()
	inboxSharePartitions(t, func(t *testing.T, partitions int) {
		const n, poison = 400, 137
		dlq := brokerDLQ(t)
		f := newInboxShareFleet(t, partitions, n, inboxShareSpec{Delay: 50 * time.Millisecond,
			Sessions: 2, Poll: 8, Concurrency: 8, Poison: strconv.Itoa(poison), DLQ: dlq})
		a, b, c := f.start("c1"), f.start("c2"), f.start("c3")
		f.waitEffects(n/3, 2*time.Minute)
		sa := f.stop(a, 30*time.Second)
		f.exactlyOnce(n-1, 2*time.Minute)
		if got := f.effects("value = $1", strconv.Itoa(poison)); got != 0 {
			t.Fatalf("the poison record has %d effects", got)
		}
		recs := readAll(t, dlq, 1)
		var off, part string
		off, _ = recordHeader(recs[0], "__dlq.errors.offset")
		part, _ = recordHeader(recs[0], "__dlq.errors.partition")
		p, _ := strconv.Atoi(part)
		o, _ := strconv.ParseInt(off, 10, 64)
		// The poison record is the one whose value is its index; find its
		// partition and offset among the others' rows.
		if len(recs) != 1 || inboxCount(t, f.pool, `SELECT count(*) FROM tidemark_inbox WHERE partition = $1 AND "offset" = $2`, p, o) != 0 {
			t.Fatalf("broker DLQ: %d records, the first for %s@%s (it must be the poison record, which has no inbox row)", len(recs), part, off)
		}
		sb, sc := f.stop(b, 30*time.Second), f.stop(c, 30*time.Second)
		t.Logf("SIGTERMed c1 applied %d; c2 %d, c3 %d; dead letter %s@%s", sa.Applied, sb.Applied, sc.Applied, part, off)
		if sa.Applied == 0 {
			t.Fatal("c1 applied nothing before its SIGTERM: the test stopped an idle process")
		}
	})
}

// TestInboxSharePoisonCrashes: a poison record that kills every process
// that runs it (exit 7, as a segfaulting decoder would) is delivered again
// after each crash, at a higher delivery count, until the broker's
// delivery limit (share.delivery.count.limit = 3): then the broker archives
// it and writes it to the group's dead-letter topic, with the delivery
// count in its headers. Crashed processes are restarted; every other record
// is applied exactly once, the poison record never. One record per poll,
// so no other record shares the poison record's deliveries (a record
// acquired with it by a process that crashes is delivered again too, and
// would reach the limit with it).
func TestInboxSharePoisonCrashes(t *testing.T) {
	t.Parallel()
	const n, poison, limit = 60, 23, 3
	dlq := brokerDLQ(t)
	f := newInboxShareFleet(t, 1, n, inboxShareSpec{Sessions: 1, Poll: 1, Concurrency: 1,
		Poison: strconv.Itoa(poison), Crash: true, DLQ: dlq, DeliveryLimit: limit})
	live := map[*shareChild]bool{f.start("c1"): true, f.start("c2"): true, f.start("c3"): true}
	crashes, started := 0, 3
	st := newStall(time.Minute) // effects and crashes must keep coming
	for f.effects("true") < n-1 || crashes < limit {
		if e := f.effects("true"); st.over(fmt.Sprint(e, crashes)) {
			t.Fatalf("%d effects of %d, %d crashes (want %d): %s", e, n-1, crashes, limit, st)
		}
		for c := range live {
			select {
			case err := <-c.done:
				c.done <- err
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 7 {
					t.Fatalf("process %s ended with %v, want the poison record's exit 7 (log %s)", c.name, err, c.log)
				}
				crashes++
				delete(live, c)
				started++
				live[f.start(fmt.Sprintf("c%d", started))] = true
			default:
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	recs := readAll(t, dlq, 1)
	off, _ := recordHeader(recs[0], "__dlq.errors.offset")
	count, _ := recordHeader(recs[0], "__dlq.errors.delivery.count")
	msg, _ := recordHeader(recs[0], "__dlq.errors.message")
	t.Logf("%d crashes; dead letter for offset %s, delivery count %s, message %q", crashes, off, count, msg)
	if len(recs) != 1 || off != strconv.Itoa(poison) || count != strconv.Itoa(limit) {
		t.Fatalf("broker DLQ: %d records, the first for offset %q at delivery count %q; want one, for offset %d at %d", len(recs), off, count, poison, limit)
	}
	if crashes != limit {
		t.Fatalf("%d crashes, want one per delivery: %d", crashes, limit)
	}
	for c := range live {
		f.stop(c, 30*time.Second)
	}
	f.exactlyOnce(n-1, time.Minute)
	if got := f.effects("value = $1", strconv.Itoa(poison)); got != 0 {
		t.Fatalf("the poison record has %d effects", got)
	}
}
