//go:build integration

package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
)

// record is one order as it is in the topic.
type record struct {
	partition int32
	offset    int64
	id        string
	customer  string
	amount    int64
}

// readBack reads every record of topic from the start up to end (the
// partitions' end offsets) with a plain franz-go client.
func readBack(t *testing.T, brokers []string, topic string) []record {
	t.Helper()
	end := bed.EndOffsets(t, topic)
	offsets := map[int32]kgo.Offset{}
	left := 0
	for p, e := range end {
		if e > 0 {
			offsets[p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []record
	done := map[int32]bool{}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("reading %s back: %v", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end[r.Partition] {
				return
			}
			var o struct {
				ID          string `json:"id"`
				Customer    string `json:"customer"`
				AmountCents int64  `json:"amount_cents"`
			}
			if err := json.Unmarshal(r.Value, &o); err != nil {
				t.Errorf("%s/%d@%d: not an order: %v", topic, r.Partition, r.Offset, err)
			}
			out = append(out, record{partition: r.Partition, offset: r.Offset, id: o.ID, customer: o.Customer, amount: o.AmountCents})
			if r.Offset == end[r.Partition]-1 && !done[r.Partition] {
				done[r.Partition] = true
				left--
			}
		})
	}
	return out
}

// result is what check found. duplicated and lost count records: with
// more than one application, and with none (or no inbox row, or no order
// row).
type result struct {
	lost, duplicated, orderViolations int
}

// pos is a record's place in the topic.
type pos struct {
	p int32
	o int64
}

func (q pos) String() string { return fmt.Sprintf("%d@%d", q.p, q.o) }

// tally is the strict effect's count of applications per record
// (examples/orders -effect strict: one applications row per application,
// nothing idempotent about it), against the records of the topic.
type tally struct {
	rows       int             // applications rows of the topic
	duplicated map[pos][]int32 // records applied more than once: the pid of each application
	lost       []pos           // records never applied
	phantoms   []string        // applications of no record of the topic
}

// countApplications reads the applications table and compares it with
// recs. A missing table fails the test: the consumers did not run the
// strict effect, and nothing would say whether a record was applied
// twice.
func countApplications(t *testing.T, pool *pgxpool.Pool, topic string, recs []record) tally {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT part, "offset", order_id, pid FROM applications WHERE topic = $1 ORDER BY seq`, topic)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			t.Fatalf("the applications table is missing: the consumers must run the strict effect (examples/orders -effect strict, ORDERS_EFFECT=strict), or duplicates cannot be counted: %v", err)
		}
		t.Fatal(err)
	}
	byPos := make(map[pos]string, len(recs))
	for _, r := range recs {
		byPos[pos{r.partition, r.offset}] = r.id
	}
	var tl tally
	pids := make(map[pos][]int32, len(recs))
	for rows.Next() {
		var q pos
		var id string
		var pid int32
		if err := rows.Scan(&q.p, &q.o, &id, &pid); err != nil {
			t.Fatal(err)
		}
		tl.rows++
		if want, ok := byPos[q]; !ok || want != id {
			tl.phantoms = append(tl.phantoms, fmt.Sprintf("%s (order %s, pid %d)", q, id, pid))
			continue
		}
		pids[q] = append(pids[q], pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	tl.duplicated = map[pos][]int32{}
	for q := range byPos {
		switch n := len(pids[q]); {
		case n == 0:
			tl.lost = append(tl.lost, q)
		case n > 1:
			tl.duplicated[q] = pids[q]
		}
	}
	sort.Slice(tl.lost, func(i, j int) bool {
		return tl.lost[i].p < tl.lost[j].p || tl.lost[i].p == tl.lost[j].p && tl.lost[i].o < tl.lost[j].o
	})
	return tl
}

// describe lists the duplicated records with their applications' pids.
func (tl tally) describe() string {
	var out []string
	for q, ps := range tl.duplicated {
		out = append(out, fmt.Sprintf("%s ×%d (pids %v)", q, len(ps), ps))
	}
	sort.Strings(out)
	return head(out)
}

// check compares the database with the records of the topic:
//
//   - the inbox has exactly one row per record (partition, offset): a
//     missing row is a lost record, a row for no record a phantom;
//   - the orders table has exactly one row per order id, at the record's
//     partition and offset, with its customer and amount;
//   - each record has exactly one row in the applications table of the
//     strict effect (examples/orders -effect strict), which nothing but the
//     inbox keeps from growing on a replay: a record with more rows was
//     applied twice (duplicated), one with none was lost;
//   - each customer's running total (orders, cents) equals the sum over the
//     topic's records: the strict effect adds every application, so an
//     effect applied twice counts an order twice;
//   - each customer's orders of one partition, in the order they were
//     applied (seq), have increasing offsets.
func check(t *testing.T, pool *pgxpool.Pool, group, topic string, recs []record, keyOrder bool) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var res result
	byPos := make(map[pos]record, len(recs))
	byID := make(map[string]record, len(recs))
	want := map[string][2]int64{}
	for _, r := range recs {
		byPos[pos{r.partition, r.offset}] = r
		// Every record counts in the totals: the strict effect adds each
		// application, also of an order id seen before.
		w := want[r.customer]
		want[r.customer] = [2]int64{w[0] + 1, w[1] + r.amount}
		if _, dup := byID[r.id]; dup {
			// The producer is idempotent; a second copy would be a
			// second record of the same order, with one orders row (the
			// table's primary key). Say so, it is worth knowing.
			t.Logf("order %s is in the topic twice", r.id)
			continue
		}
		byID[r.id] = r
	}

	// The inbox.
	rows, err := pool.Query(ctx, `SELECT partition, "offset" FROM tidemark_inbox WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[pos]bool, len(recs))
	var phantoms []string
	for rows.Next() {
		var q pos
		if err := rows.Scan(&q.p, &q.o); err != nil {
			t.Fatal(err)
		}
		if _, ok := byPos[q]; !ok {
			phantoms = append(phantoms, fmt.Sprintf("%d@%d", q.p, q.o))
		}
		seen[q] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Retention (examples/orders runs it in share mode) deletes rows below
	// a partition's applied mark: those records are consumed; their
	// effects are checked below with the orders.
	marks := map[int32]int64{}
	rows, err = pool.Query(ctx, `SELECT partition, applied_below FROM tidemark_lease WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int32
		var m int64
		if err := rows.Scan(&p, &m); err != nil {
			t.Fatal(err)
		}
		marks[p] = m
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var lostRows []string
	pruned := 0
	for q := range byPos {
		switch {
		case seen[q]:
		case q.o < marks[q.p]:
			pruned++
		default:
			lostRows = append(lostRows, fmt.Sprintf("%d@%d", q.p, q.o))
		}
	}
	if pruned > 0 {
		t.Logf("chaos: %d inbox rows pruned by retention (below the applied marks %v)", pruned, marks)
	}
	sort.Strings(lostRows)
	if len(lostRows) > 0 {
		t.Errorf("LOST: %d records have no inbox row: %s", len(lostRows), head(lostRows))
	}
	if len(phantoms) > 0 {
		t.Errorf("%d inbox rows name no record of the topic: %s", len(phantoms), head(phantoms))
	}

	// The orders.
	rows, err = pool.Query(ctx, `SELECT id, customer, amount_cents, part, "offset", seq FROM orders ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type applied struct {
		record
		seq int64
	}
	gotIDs := map[string]bool{}
	perCustomer := map[string][]applied{}
	var wrong []string
	for rows.Next() {
		var a applied
		if err := rows.Scan(&a.id, &a.customer, &a.amount, &a.partition, &a.offset, &a.seq); err != nil {
			t.Fatal(err)
		}
		gotIDs[a.id] = true
		r, ok := byID[a.id]
		if !ok || r.partition != a.partition || r.offset != a.offset || r.customer != a.customer || r.amount != a.amount {
			wrong = append(wrong, fmt.Sprintf("%s (%s %d at %d@%d; topic: %+v)", a.id, a.customer, a.amount, a.partition, a.offset, r))
		}
		// Per customer and partition: after partitions are added, the
		// default partitioner maps some customers to a new partition,
		// whose records may run before the old partition's backlog; the
		// order of a key is promised within a partition only.
		k := fmt.Sprintf("%s in partition %d", a.customer, a.partition)
		perCustomer[k] = append(perCustomer[k], a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for id := range byID {
		if !gotIDs[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("LOST: %d orders have no effect: %s", len(missing), head(missing))
	}
	if len(wrong) > 0 {
		t.Errorf("%d order rows do not match their record: %s", len(wrong), head(wrong))
	}
	res.lost = max(len(lostRows), len(missing))

	// The applications: the check a replay applied again cannot pass.
	tl := countApplications(t, pool, topic, recs)
	t.Logf("chaos: %d applications (the strict effect's rows) for %d records", tl.rows, len(recs))
	res.duplicated = len(tl.duplicated)
	res.lost = max(res.lost, len(tl.lost))
	if len(tl.duplicated) > 0 {
		t.Errorf("DUPLICATED: %d records applied more than once (%d applications for %d records): %s",
			len(tl.duplicated), tl.rows, len(recs), tl.describe())
	}
	if len(tl.lost) > 0 {
		lost := make([]string, len(tl.lost))
		for i, q := range tl.lost {
			lost[i] = q.String()
		}
		t.Errorf("LOST: %d records have no application: %s", len(lost), head(lost))
	}
	if len(tl.phantoms) > 0 {
		t.Errorf("%d applications name no record of the topic: %s", len(tl.phantoms), head(tl.phantoms))
	}

	// Key order: rows come in seq order; per customer and partition the
	// offsets must rise (not over a share group, which promises no order).
	var order []string
	for c, as := range perCustomer {
		if !keyOrder {
			break
		}
		for i := 1; i < len(as); i++ {
			if as[i].offset <= as[i-1].offset {
				res.orderViolations++
				order = append(order, fmt.Sprintf("%s: %d@%d (seq %d) applied after %d@%d (seq %d)",
					c, as[i].partition, as[i].offset, as[i].seq, as[i-1].partition, as[i-1].offset, as[i-1].seq))
			}
		}
	}
	if len(order) > 0 {
		t.Errorf("KEY ORDER: %d effects applied out of offset order: %s", len(order), head(order))
	}

	// The totals: an effect applied twice shows here.
	rows, err = pool.Query(ctx, `SELECT customer, orders, total_cents FROM customer_totals`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for rows.Next() {
		var c string
		var n, cents int64
		if err := rows.Scan(&c, &n, &cents); err != nil {
			t.Fatal(err)
		}
		got[c] = [2]int64{n, cents}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var mismatch []string
	extra := 0
	for c := range mergeKeys(want, got) {
		if w, g := want[c], got[c]; w != g {
			mismatch = append(mismatch, fmt.Sprintf("%s: %d orders %d cents, topic says %d orders %d cents", c, g[0], g[1], w[0], w[1]))
			if g[0] > w[0] {
				extra += int(g[0] - w[0])
			}
		}
	}
	sort.Strings(mismatch)
	if len(mismatch) > 0 {
		t.Errorf("TOTALS: %d customers' totals differ from the topic (%d orders counted more than once): %s", len(mismatch), extra, head(mismatch))
	}
	return res
}

func mergeKeys(a, b map[string][2]int64) map[string]bool {
	out := make(map[string]bool, len(a))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// head returns the first few of xs, joined.
func head(xs []string) string {
	if len(xs) > 10 {
		return strings.Join(xs[:10], ", ") + fmt.Sprintf(", … (%d more)", len(xs)-10)
	}
	return strings.Join(xs, ", ")
}

// deadLettered is the number of records in the dead-letter topic (0 when
// it was never created).
func deadLettered(t *testing.T, dlq string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listed, err := bed.Admin(t).ListEndOffsets(ctx, dlq)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", dlq, err)
	}
	var n int64
	for _, ps := range listed {
		for _, o := range ps {
			switch {
			case o.Err == nil:
				n += o.Offset
			case !errors.Is(o.Err, kerr.UnknownTopicOrPartition): // never created: none
				t.Fatalf("end offset of %s/%d: %v", dlq, o.Partition, o.Err)
			}
		}
	}
	return n
}

// report logs the summary and writes it as JSON to TIDEMARK_CHAOS_SUMMARY
// when that is set.
func report(t *testing.T, s summary) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary (%s mode, %d Kafka node(s), seed %d)\n", s.Mode, s.Nodes, s.Seed)
	fmt.Fprintf(&b, "  fault phase        %.1fs (run %.1fs), %d partitions, %d consumers started\n", s.FaultPhase, s.Total, s.Partitions, s.ConsumersRun)
	fmt.Fprintf(&b, "  produced           %d orders, acks=all (%d produce failures)\n", s.Produced, s.ProduceFailed)
	fmt.Fprintf(&b, "  faults survived    %d\n", s.FaultsTotal)
	for _, k := range faultKinds {
		f := s.Faults[k]
		if s.Nodes < replicas && slices.Contains(brokerFaultKinds, k) {
			continue // not dealt on a bed of one node
		}
		fmt.Fprintf(&b, "    %-17s %3d   recovery worst %5.1fs  mean %5.1fs\n", k, f.Count, f.WorstRecovery, f.MeanRecovery)
	}
	fmt.Fprintf(&b, "  worst recovery     %.1fs (%s)\n", s.WorstRecovery, s.WorstKind)
	if s.Nodes >= replicas {
		fmt.Fprintf(&b, "  worst wait for the cluster back in sync after a fault %.1fs\n", s.WorstBackInSync)
	}
	reportCommits(&b, s)
	fmt.Fprintf(&b, "  final catch-up     %.1fs\n", s.FinalCatchUp)
	if s.Mode == "share" {
		fmt.Fprintf(&b, "  lag samples        %d (%d failed during restarts)\n", s.Samples, s.SamplesFailed)
	} else {
		fmt.Fprintf(&b, "  offset samples     %d (%d failed during restarts), backward commits %d\n", s.Samples, s.SamplesFailed, s.BackwardCommits)
	}
	order := fmt.Sprintf("key order violations %d", s.OrderViolations)
	if s.Mode == "share" {
		order = "key order not checked (share group)"
	}
	fmt.Fprintf(&b, "  lost %d, duplicated %d (records applied 0 / more than once: the strict effect's applications), %s, dead-lettered %d\n",
		s.Lost, s.Duplicated, order, s.DeadLettered)
	fmt.Fprintf(&b, "  result             %s", map[bool]string{true: "PASS", false: "FAIL"}[s.Pass])
	t.Log(b.String())
	if path := os.Getenv("TIDEMARK_CHAOS_SUMMARY"); path != "" {
		js, err := json.MarshalIndent(s, "", "  ")
		if err == nil {
			err = os.WriteFile(path, append(js, '\n'), 0o644)
		}
		if err != nil {
			t.Errorf("writing the summary to %s: %v", path, err)
		}
	}
}
