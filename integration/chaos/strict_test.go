//go:build integration

package chaos_test

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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/promtext"
)

// The knobs of TestStrictCheckBites: 600 orders at about 160 a second
// (4 handlers, 25 ms each), so that a consumer killed mid-stream has
// applied records its group has not committed yet (the runner commits
// once a second).
const (
	strictRecords     = 600
	strictPartitions  = 4
	strictConcurrency = 4
	strictDelay       = 25 * time.Millisecond
	// strictBacklog is how many records the consumer must have applied
	// above the group's committed offsets when it is killed: they are
	// redelivered to the next one.
	strictBacklog = 20
)

// TestStrictCheckBites proves that the suite's duplicate check can fail:
// one consumer of the orders example with the strict effect is killed
// with SIGKILL mid-stream, after it applied records its group had not
// committed, and the next consumer gets those records again.
//
//   - Replay protection off (examples/orders built with the tidemark_unsafe
//     tag, ORDERS_UNSAFE_NO_REPLAY_PROTECTION=true): the check must count
//     duplicates, each a record applied first by the killed consumer.
//   - Replay protection on — the same variable set, but a build without
//     the tag, which cannot switch it off: every check of the suite
//     passes, duplicates 0, and the next consumer's inbox counted the
//     redelivered records as replays (otherwise the 0 would prove
//     nothing).
func TestStrictCheckBites(t *testing.T) {
	for _, tc := range []struct {
		name string
		tags string // go build -tags for examples/orders
		off  bool   // replay protection off
	}{
		{"protection off", "tidemark_unsafe", true},
		{"protection on", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) { strictRun(t, tc.tags, tc.off) })
	}
}

func strictRun(t *testing.T, tags string, off bool) {
	brokers := bed.Kafka(t)
	pool := bed.PG(t)
	ctx := context.Background()
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	topic, group := bed.Topic(t, strictPartitions), bed.Group(t)
	dlq := topic + ".dlq"
	adm := bed.Admin(t)
	t.Cleanup(func() { // registered after bed.Topic's: runs before it
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopic(ctx, dlq)
	})
	produceOrders(t, brokers, topic, strictRecords)

	bin := filepath.Join(t.TempDir(), "orders")
	build := []string{"build", "-o", bin}
	if tags != "" {
		build = append(build, "-tags", tags)
	}
	if out, err := exec.Command("go", append(build, "../../examples/orders")...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(build, " "), err, out)
	}
	// synchronous_commit=on as in TestChaos: a COMMIT acknowledged is on
	// disk.
	svcDSN := serviceDSN(schema, "synchronous_commit=on")
	// The DSN in the environment, not in argv, which every user of the
	// machine can read.
	args := []string{"-brokers", strings.Join(brokers, ","), "-group", group, "-topic", topic,
		"-dlq", dlq, "-http", "127.0.0.1:0", "-concurrency", strconv.Itoa(strictConcurrency),
		"-delay", strictDelay.String(), "-session-timeout", sessionTimeout.String()}
	// Set in both runs: without the tag it must change nothing.
	env := []string{"TIDEMARK_PG_DSN=" + svcDSN, "TIDEMARK_SHUTDOWN_BUDGET=10s", "ORDERS_UNSAFE_NO_REPLAY_PROTECTION=true"}
	logDir := logDirectory(t)
	fl := newFleet(t, bin, logDir, args, env)

	// Kill a consumer once it has applied strictBacklog records above the
	// committed offsets. A commit may land between that reading and the
	// kill; the offsets read once the process is gone decide how many
	// records it leaves to be redelivered, and a kill that left none is
	// tried again with the next consumer.
	killed := map[int32]bool{}
	redelivered := 0
	for attempt := 1; redelivered == 0; attempt++ {
		if attempt > 3 {
			t.Fatalf("3 consumers were killed and none left an applied record above the committed offsets (logs in %s)", logDir)
		}
		c, err := fl.start()
		if err != nil {
			t.Fatal(err)
		}
		pid := int32(c.cmd.Process.Pid)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			n, above := backlog(t, pool, group, topic, pid)
			if above >= strictBacklog {
				break
			}
			if n >= strictRecords*3/4 || time.Now().After(deadline) {
				t.Fatalf("%s applied %d of %d records without %d above the committed offsets, or not within 2 minutes: too fast or too slow to kill mid-stream (log %s)",
					c.name, n, strictRecords, strictBacklog, c.log)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := fl.signal(c, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.done
		killed[pid] = true
		// A COMMIT the process sent to PostgreSQL, or an offset commit it
		// sent to Kafka, just before it died may still be carried out; 2 s
		// later both are decided. Nothing else can commit for the group
		// meanwhile: the next consumer starts after this reading.
		time.Sleep(2 * time.Second)
		_, redelivered = backlog(t, pool, group, topic, pid)
		t.Logf("strict: killed %s (pid %d) with %d applied records above the committed offsets", c.name, pid, redelivered)
	}

	last, err := fl.start()
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 3*time.Minute, func() bool { return caughtUp(t, pool, group, topic) }); err != nil {
		t.Fatalf("%s did not apply and commit every record within 3 minutes (log %s)", last.name, last.log)
	}
	addr := httpAddr(t, last)
	m, err := promtext.Scrape(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := fl.stop(last, 30*time.Second); err != nil || code != 0 {
		t.Fatalf("%s: exit %d after SIGTERM, want 0: %v (log %s)", last.name, code, err, last.log)
	}
	logged, err := os.ReadFile(last.log)
	if err != nil {
		t.Fatal(err)
	}

	recs := readBack(t, brokers, topic)
	tl := countApplications(t, pool, topic, recs)
	found, skipped := m["tidemark_inbox_replays_total"], m["tidemark_records_replay_skipped_total"]
	t.Logf("strict: %s: %d records, %d applications, %d duplicated, %d lost; %d redelivered after the kill; the last consumer's inbox skipped %.0f replays (%.0f found their inbox row, %.0f skipped by the assign hook's applied offsets)",
		t.Name(), len(recs), tl.rows, len(tl.duplicated), len(tl.lost), redelivered, found+skipped, found, skipped)
	if len(recs) != strictRecords {
		t.Errorf("the topic holds %d records, %d were produced", len(recs), strictRecords)
	}
	if off {
		if !strings.Contains(string(logged), "REPLAY PROTECTION OFF") {
			t.Fatalf("the tidemark_unsafe build did not log that replay protection is off: the hook was not reached (log %s)", last.log)
		}
		// The check bites: what the killed consumer applied above the
		// committed offsets came back and was applied again.
		if len(tl.duplicated) == 0 {
			t.Fatalf("DUPLICATE CHECK DID NOT BITE: replay protection off, %d records redelivered after a SIGKILL, and the applications count 0 duplicated", redelivered)
		}
		// Each redelivered record, and nothing else, was applied again.
		if len(tl.duplicated) != redelivered {
			t.Errorf("%d records duplicated, want the %d redelivered: %s", len(tl.duplicated), redelivered, tl.describe())
		}
		for q, pids := range tl.duplicated {
			if !killed[pids[0]] {
				t.Errorf("record %s: first applied by pid %d, not by a killed consumer (%v): applied twice for another reason", q, pids[0], pids)
			}
		}
		if len(tl.lost) > 0 {
			t.Errorf("%d records never applied", len(tl.lost))
		}
		if found+skipped != 0 {
			t.Errorf("replay protection off, yet the inbox counted %.0f replays", found+skipped)
		}
		return
	}
	if !strings.Contains(string(logged), "ORDERS_UNSAFE_NO_REPLAY_PROTECTION is ignored") {
		t.Errorf("a build without tidemark_unsafe did not log that it ignores ORDERS_UNSAFE_NO_REPLAY_PROTECTION (log %s)", last.log)
	}
	// Every check of the suite, duplicates counted as above.
	res := check(t, pool, group, topic, recs, true)
	if res.duplicated != 0 || res.lost != 0 {
		t.Errorf("replay protection on: %d duplicated, %d lost; want 0 and 0", res.duplicated, res.lost)
	}
	if found+skipped == 0 {
		t.Errorf("the last consumer's inbox skipped no replay though %d records were redelivered: the 0 duplicated proves nothing", redelivered)
	} else if int(found+skipped) != redelivered {
		t.Errorf("the last consumer's inbox skipped %.0f replays, want the %d records redelivered", found+skipped, redelivered)
	}
	if !t.Failed() {
		_ = os.RemoveAll(logDir)
	}
}

// produceOrders writes n orders to topic, keyed by customer as TestChaos's
// producers write them, and returns once all are acknowledged.
func produceOrders(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		c := fmt.Sprintf("customer-%04d", (i*31)%customers)
		v, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("order-%d", i), "customer": c, "amount_cents": 100 + (i*7919)%10000})
		recs[i] = &kgo.Record{Key: []byte(c), Value: v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing %d orders: %v", n, err)
	}
}

// committedAll returns group's committed offset of every partition of
// topic, -1 where it has none.
func committedAll(t *testing.T, group, topic string) (parts []int32, offs []int64) {
	t.Helper()
	c := bed.Committed(t, group, topic)
	for p := range int32(strictPartitions) {
		o, ok := c[p]
		if !ok || o < 0 {
			o = -1
		}
		parts, offs = append(parts, p), append(offs, o)
	}
	return parts, offs
}

// backlog returns how many records the process pid has applied (the
// applications table) and how many of those are at or above the group's
// committed offsets: the records a new owner gets again. Before the
// table exists both are 0.
func backlog(t *testing.T, pool *pgxpool.Pool, group, topic string, pid int32) (applied, above int) {
	t.Helper()
	parts, offs := committedAll(t, group, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE a."offset" >= c.o)
FROM applications a JOIN unnest($2::int[], $3::bigint[]) AS c(p, o) ON a.part = c.p
WHERE a.topic = $1 AND a.pid = $4`, topic, parts, offs, pid).Scan(&applied, &above)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return 0, 0 // the first consumer has not created its tables yet
	}
	if err != nil {
		t.Fatalf("reading the applications: %v", err)
	}
	return applied, above
}

// caughtUp reports whether every record of topic has an application and
// group has committed every partition's end offset.
func caughtUp(t *testing.T, pool *pgxpool.Pool, group, topic string) bool {
	t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT (part, "offset")) FROM applications WHERE topic = $1`, topic).Scan(&n); err != nil {
		t.Fatalf("reading the applications: %v", err)
	}
	if n < strictRecords {
		return false
	}
	end := bed.EndOffsets(t, topic)
	_, offs := committedAll(t, group, topic)
	for p, o := range offs {
		if o != end[int32(p)] {
			return false
		}
	}
	return true
}

// httpAddr is the address c serves its probes and metrics on, from the
// line of its log that says so.
func httpAddr(t *testing.T, c *consumer) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		f, err := os.Open(c.log)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Addr != "" && strings.HasPrefix(l.Msg, "serving probes") {
				f.Close()
				return l.Addr
			}
		}
		f.Close()
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not log its HTTP address within 30s (log %s)", c.name, c.log)
	return ""
}
