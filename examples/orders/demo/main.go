// Command demo is `make demo`: on the running test bed it creates a fresh
// orders topic, produces 100,000 orders, runs two instances of the orders
// service in one group, stops one with SIGTERM halfway and starts it again,
// and then checks the result against the topic: every order applied once,
// per-customer totals equal to a recomputation from the topic, no
// duplicates. It prints a summary and exits non-zero if a check fails.
//
// The instances run the strict effect (orders -effect strict): it is not
// idempotent by itself — every application appends a row to the
// applications table and adds to the totals — so the duplicates the
// summary counts (records with more than one application) are kept at 0
// by the inbox alone, and the summary says how many replays the inbox
// skipped after the SIGTERM (from the instances' /metrics).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/promtext"
)

func main() {
	n := flag.Int("n", 100_000, "orders to produce")
	partitions := flag.Int("partitions", 12, "partitions of the orders topic")
	flag.Parse()
	if err := run(*n, *partitions); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
}

type instance struct {
	name string
	addr string // of its /metrics
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

func run(n, partitions int) error {
	began := time.Now()
	brokers, dsn := os.Getenv("TIDEMARK_KAFKA_BROKERS"), os.Getenv("TIDEMARK_PG_DSN")
	if brokers == "" || dsn == "" {
		return errors.New("TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN are not set: scripts/testbed up && source .testbed/env")
	}
	stamp := time.Now().Format("20060102150405")
	topic, group, schema := "orders-demo-"+stamp, "orders-demo-"+stamp, "orders_demo_"+stamp
	work, err := os.MkdirTemp("", "tidemark-demo-")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if ok {
			os.RemoveAll(work)
		} else {
			fmt.Fprintf(os.Stderr, "demo: the services' logs are kept in %s\n", work)
		}
	}()

	// A fresh schema per run, so the checks see only this run's rows.
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("creating schema %s: %w", schema, err)
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	svcDSN := dsn + sep + "search_path=" + schema

	fmt.Printf("building the orders service and producer...\n")
	bin := filepath.Join(work, "orders")
	prod := filepath.Join(work, "produce")
	for out, pkg := range map[string]string{bin: "./examples/orders", prod: "./examples/orders/produce"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	t0 := time.Now()
	if b, err := exec.Command(prod, "-brokers", brokers, "-topic", topic, "-create", "-partitions", fmt.Sprint(partitions), "-n", fmt.Sprint(n)).CombinedOutput(); err != nil {
		return fmt.Errorf("produce: %v\n%s", err, b)
	}
	fmt.Printf("produced   %d orders to %s (%d partitions) in %s\n", n, topic, partitions, time.Since(t0).Round(time.Millisecond))

	start := func(name, port string) (*instance, error) {
		logf, err := os.Create(filepath.Join(work, name+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "-brokers", brokers, "-group", group, "-topic", topic,
			"-dlq", topic+".dlq", "-http", "127.0.0.1:"+port, "-effect", "strict")
		cmd.Stdout, cmd.Stderr = logf, logf
		// The connection string in the environment, not in argv, where
		// every user of the machine can read its password (ps).
		cmd.Env = append(os.Environ(), "TIDEMARK_SHUTDOWN_BUDGET=15s", "TIDEMARK_PG_DSN="+svcDSN)
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		in := &instance{name: name, addr: "127.0.0.1:" + port, cmd: cmd, done: make(chan error, 1), log: logf}
		go func() { in.done <- cmd.Wait() }()
		return in, nil
	}
	stop := func(in *instance) (int, time.Duration, error) {
		t := time.Now()
		_ = in.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-in.done:
		case <-time.After(30 * time.Second):
			_ = in.cmd.Process.Kill()
			return -1, 0, fmt.Errorf("%s did not exit within 30s of SIGTERM (log %s)", in.name, in.log.Name())
		}
		return in.cmd.ProcessState.ExitCode(), time.Since(t), nil
	}
	applied := func() (int64, error) {
		var c int64
		err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".orders").Scan(&c)
		return c, err
	}
	waitApplied := func(want int64, within time.Duration) error {
		deadline := time.Now().Add(within)
		for {
			c, err := applied()
			if err == nil && c >= want {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d orders applied after %s (err %v; logs in %s)", c, want, within, err, work)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t1 := time.Now()
	a, err := start("a", "18081")
	if err != nil {
		return err
	}
	b, err := start("b", "18082")
	if err != nil {
		return err
	}
	defer func() {
		for _, in := range []*instance{a, b} {
			if in != nil && in.cmd.ProcessState == nil {
				_ = in.cmd.Process.Kill()
			}
		}
	}()
	fmt.Printf("started    two instances of the orders service in group %s\n", group)
	if err := waitApplied(int64(n/2), 3*time.Minute); err != nil {
		return err
	}
	// The replays counted so far, to tell those of the hand-off apart.
	before, err := replaysOf(a, b)
	if err != nil {
		return err
	}
	bBefore, err := replaysOf(b)
	if err != nil {
		return err
	}
	code, took, err := stop(a)
	if err != nil {
		return err
	}
	c, _ := applied()
	fmt.Printf("SIGTERM    instance a at %d applied: exited %d after %s\n", c, code, took.Round(time.Millisecond))
	if code != 0 {
		return fmt.Errorf("instance a exited %d after SIGTERM, want 0 (log %s)", code, a.log.Name())
	}
	if a, err = start("a", "18081"); err != nil {
		return err
	}
	fmt.Printf("restarted  instance a\n")
	if err := waitApplied(int64(n), 3*time.Minute); err != nil {
		return err
	}
	// Wait until the group committed the end offsets, then stop both.
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(time.Minute)
	for {
		ends, err1 := adm.ListEndOffsets(ctx, topic)
		comm, err2 := adm.FetchOffsetsForTopics(ctx, group, topic)
		done := err1 == nil && err2 == nil
		if done {
			ends.Each(func(o kadm.ListedOffset) {
				if c, ok := comm.Lookup(topic, o.Partition); !ok || c.At != o.Offset {
					done = false
				}
			})
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the group did not commit the end offsets within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
	consumeTook := time.Since(t1)
	// Since the SIGTERM: b's counters grew by its share of the hand-off,
	// and the restarted a counts from zero.
	after, err := replaysOf(a, b)
	if err != nil {
		return err
	}
	handoff := after.minus(bBefore)
	for _, in := range []*instance{a, b} {
		code, _, err := stop(in)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("instance %s exited %d at the end, want 0 (log %s)", in.name, code, in.log.Name())
		}
	}

	// Checks: recompute the totals from the topic itself.
	want, produced, records, err := recompute(brokers, topic, n)
	if err != nil {
		return err
	}
	got := map[string][2]int64{}
	rows, err := admin.Query(ctx, "SELECT customer, orders, total_cents FROM "+schema+".customer_totals")
	if err != nil {
		return err
	}
	for rows.Next() {
		var c string
		var o, t int64
		if err := rows.Scan(&c, &o, &t); err != nil {
			return err
		}
		got[c] = [2]int64{o, t}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var orders, inboxRows, sumOrders int64
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".orders").Scan(&orders); err != nil {
		return err
	}
	_ = admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".tidemark_inbox").Scan(&inboxRows)
	// The strict effect's applications, per record: a record with more
	// than one was applied twice, whatever the totals say.
	var apps, appRecords, appDups int64
	if err := admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT (part, "offset")),
		(SELECT count(*) FROM (SELECT FROM `+schema+`.applications GROUP BY part, "offset" HAVING count(*) > 1) d)
		FROM `+schema+`.applications`).Scan(&apps, &appRecords, &appDups); err != nil {
		return fmt.Errorf("counting the applications: %w", err)
	}
	mismatch := 0
	for c, w := range want {
		if got[c] != w {
			mismatch++
		}
		sumOrders += got[c][0]
	}
	fmt.Printf("\nsummary\n")
	fmt.Printf("  produced              %d orders (%d read back from the topic)\n", n, produced)
	fmt.Printf("  applied               %d orders, %d inbox rows\n", orders, inboxRows)
	fmt.Printf("  customer totals       %d customers, %d mismatches against a recomputation from the topic\n", len(want), mismatch)
	fmt.Printf("  applications          %d for %d records (strict effect: one row per application)\n", apps, appRecords)
	fmt.Printf("  duplicates            %d records applied more than once, %d never applied\n", appDups, int64(records)-appRecords)
	fmt.Printf("  replays skipped       %d after the SIGTERM (hand-off and restart): %d found their inbox row, %d skipped by the assign hook's applied offsets; %d before it\n",
		handoff.total(), handoff.found, handoff.skipped, before.total())
	fmt.Printf("  consume time          %s (two instances, one stopped with SIGTERM and restarted)\n", consumeTook.Round(time.Millisecond))
	fmt.Printf("  total                 %s\n", time.Since(began).Round(time.Millisecond))
	switch {
	case int(orders) != produced:
		return fmt.Errorf("%d orders applied, %d produced", orders, produced)
	case mismatch > 0:
		return fmt.Errorf("%d customers' totals differ from the topic", mismatch)
	case sumOrders != int64(produced):
		return fmt.Errorf("totals count %d orders, %d produced: duplicates or losses", sumOrders, produced)
	case appDups > 0:
		return fmt.Errorf("%d records applied more than once (%d applications)", appDups, apps)
	case appRecords != int64(records):
		return fmt.Errorf("%d of %d records applied", appRecords, records)
	}
	fmt.Printf("  result                OK: every order applied exactly once\n")
	ok = true
	return nil
}

// recompute reads the whole topic and sums orders and amounts per customer;
// it returns the sums, the number of distinct orders and of records read.
func recompute(brokers, topic string, n int) (map[string][2]int64, int, int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, 0, 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string][2]int64{}
	seen := map[string]bool{}
	read := 0
	for read < n {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return nil, 0, 0, fmt.Errorf("reading %s back: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			read++
			var o struct {
				ID          string `json:"id"`
				Customer    string `json:"customer"`
				AmountCents int64  `json:"amount_cents"`
			}
			if json.Unmarshal(r.Value, &o) != nil || seen[o.ID] {
				return
			}
			seen[o.ID] = true
			t := out[o.Customer]
			out[o.Customer] = [2]int64{t[0] + 1, t[1] + o.AmountCents}
		})
	}
	return out, len(seen), read, nil
}

// replays are an instance's counts of records not applied again: found,
// the inbox's (tidemark.inbox.replays: the record's inbox row was there),
// and skipped, the runner's (tidemark.records.replay_skipped: the offsets
// the inbox's assign hook loaded said it was applied).
type replays struct{ found, skipped int64 }

func (r replays) total() int64 { return r.found + r.skipped }

func (r replays) minus(o replays) replays { return replays{r.found - o.found, r.skipped - o.skipped} }

// replaysOf sums the replays the instances' /metrics report.
func replaysOf(ins ...*instance) (replays, error) {
	var r replays
	for _, in := range ins {
		m, err := promtext.Scrape(context.Background(), in.addr)
		if err != nil {
			return r, fmt.Errorf("instance %s: %w", in.name, err)
		}
		r.found += int64(m["tidemark_inbox_replays_total"])
		r.skipped += int64(m["tidemark_records_replay_skipped_total"])
	}
	return r, nil
}
