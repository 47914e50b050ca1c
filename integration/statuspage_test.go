//go:build integration

package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/status"
)

// chromium returns the path of Debian's chromium, or fails the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: scripts/statuspage installs it when missing (as root: apt-get install chromium); make integration runs it first")
	return ""
}

// headless runs chromium headless on url with args (--dump-dom,
// --screenshot=...) and returns its stdout.
func headless(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// --no-sandbox: the tests run as root in a container, where
	// chromium's sandbox cannot start.
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--window-size=1400,1000"}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// freePort returns a TCP port free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// statusDoc fetches the instance's /tidemark.json.
func (p *proc) statusDoc() (status.Doc, error) {
	var d status.Doc
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/tidemark.json", p.port))
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	return d, json.NewDecoder(resp.Body).Decode(&d)
}

// TestStatusPageInChromium starts the orders example on the bed with one
// order stuck on purpose (its customer's row locked by the test), one
// malformed (dead-lettered) and one partition paused through the page's
// control, opens /tidemark in headless Chromium and checks the rendered
// DOM: the partitions table, the stuck record as the oldest unfinished
// one (its key, which holds markup, shown as text), the dead letter and
// the operator's pause. It saves a screenshot to
// $TIDEMARK_STATUSPAGE_SCREENSHOT (scripts/statuspage -screenshot sets it
// to docs/img/statuspage.png), else to a temporary directory.
func TestStatusPageInChromium(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	e := newOrdersEnv(t, 3)
	if err := e.produce(0, 300, 0); err != nil {
		t.Fatal(err)
	}
	p := e.start("a", freePort(t), "ORDERS_CONTROLS=true", "TIDEMARK_SHUTDOWN_BUDGET=5s")
	e.waitApplied(300, time.Minute)

	// Lock the stuck customer's totals row: its order's handler waits on
	// the lock, running, until the test lets go.
	ctx := context.Background()
	const stuck = "stuck"
	if _, err := e.pool.Exec(ctx, `INSERT INTO customer_totals (customer, orders, total_cents) VALUES ($1, 0, 0)`, stuck); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM customer_totals WHERE customer = $1 FOR UPDATE`, stuck); err != nil {
		t.Fatal(err)
	}

	// Pause partition 2 through the control, as an operator would.
	c := http.Client{Timeout: 15 * time.Second}
	resp, err := c.PostForm(fmt.Sprintf("http://127.0.0.1:%d/tidemark/pause", p.port), url.Values{"topic": {e.topic}, "partition": {"2"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /tidemark/pause: %d %s", resp.StatusCode, body)
	}

	const stuckKey = "<b>stuck</b>"
	cl := bed.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	order, _ := json.Marshal(map[string]any{"id": "order-stuck", "customer": stuck, "amount_cents": 1})
	stuckRec := &kgo.Record{Topic: e.topic, Partition: 0, Key: []byte(stuckKey), Value: order}
	for _, r := range []*kgo.Record{stuckRec, {Topic: e.topic, Partition: 1, Key: []byte("broken"), Value: []byte("not json")}} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// Wait until the stats show all three (the runner publishes them every
	// commit interval).
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := p.statusDoc()
		if err == nil && ready(d) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the status document did not show the stuck record, the dead letter and the pause within a minute: %+v (err %v)", d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Render the page, and take the JSON right before and after: the
	// values the page shows must be the JSON's. Commits of partitions 1
	// and 2 may still move while the dead letter settles; try again until
	// the JSON held still across the rendering.
	page := fmt.Sprintf("http://127.0.0.1:%d/tidemark", p.port)
	var dom string
	var d status.Doc
	for try := 1; ; try++ {
		before, err := p.statusDoc()
		if err != nil {
			t.Fatal(err)
		}
		dom = string(headless(t, bin, page, "--dump-dom"))
		if d, err = p.statusDoc(); err != nil {
			t.Fatal(err)
		}
		if sameValues(before, d) {
			break
		}
		if try == 5 {
			t.Fatalf("the status document kept changing while the page rendered: %+v then %+v", before, d)
		}
	}
	rows := partitionRows(t, dom, e.topic)
	if len(rows) != 3 {
		t.Fatalf("the rendered page has no partitions table of 3 rows (%d rows):\n%s", len(rows), dom)
	}
	for _, jp := range d.Partitions {
		row := rows[jp.Partition]
		if row == nil {
			t.Fatalf("the rendered page has no row for partition %d:\n%s", jp.Partition, dom)
		}
		wantLag := "?"
		if jp.Lag != nil {
			wantLag = fmt.Sprint(*jp.Lag)
		}
		off := func(o int64) string {
			if o < 0 {
				return "–"
			}
			return fmt.Sprint(o)
		}
		for col, want := range map[string]string{"lag": wantLag, "committed": off(jp.Committed),
			"high watermark": off(jp.HighWatermark), "dead letters": fmt.Sprint(jp.DeadLettered)} {
			if got := row[col]; got != want {
				t.Errorf("partition %d's row shows %s %q, the JSON %q", jp.Partition, col, got, want)
			}
		}
	}
	if got := rows[1]["dead letters"]; got != "1" {
		t.Errorf("partition 1's row shows %q dead letters, want 1 (the malformed order)", got)
	}
	if got := rows[2]["paused"]; got != `paused <span class="cause">operator</span>` {
		t.Errorf("partition 2's row shows paused %q, want paused by operator alone", got)
	}
	if got := rows[0]["paused"]; strings.HasPrefix(got, "paused") {
		t.Errorf("partition 0's row shows paused %q, want not paused", got)
	}
	oldest := regexp.MustCompile(`(?s)<tr class="oldest" data-partition="` + regexp.QuoteMeta(e.topic) + `/0">(.*?)</tr>`).FindStringSubmatch(dom)
	if oldest == nil {
		t.Fatalf("the rendered page shows no oldest unfinished record for partition 0:\n%s", dom)
	}
	for _, want := range []string{fmt.Sprintf(`<td class="offset">%d</td>`, stuckRec.Offset),
		`<td class="l key"><code>&lt;b&gt;stuck&lt;/b&gt;</code></td>`, `<td class="l state">running</td>`} {
		if !strings.Contains(oldest[1], want) {
			t.Errorf("the oldest unfinished record's row lacks %q (the stuck record is at offset %d): %s", want, stuckRec.Offset, oldest[1])
		}
	}
	if strings.Contains(dom, "<b>stuck</b>") {
		t.Error("the key's markup was rendered as markup")
	}
	if !strings.Contains(dom, `id="controls"`) {
		t.Error("the page does not show the controls")
	}
	if !strings.Contains(dom, `<span id="joined">joined</span>`) || !strings.Contains(dom, `<table id="rebalances">`) {
		t.Error("the page does not show the member as joined with its rebalances")
	}
	if m := regexp.MustCompile(`<code id="member-id">([^<]+)</code>[^<]*<b id="generation">(\d+)</b>`).FindStringSubmatch(dom); m == nil ||
		m[1] == "(none yet)" || m[2] == "0" || m[1] != d.Member.MemberID || m[2] != fmt.Sprint(d.Member.Generation) {
		t.Errorf("the page shows member id and generation %q, the JSON %q %d", m, d.Member.MemberID, d.Member.Generation)
	}

	shot := os.Getenv("TIDEMARK_STATUSPAGE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "statuspage.png")
	} else if shot, err = filepath.Abs(shot); err != nil {
		t.Fatal(err)
	}
	headless(t, bin, page, "--screenshot="+shot)
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("no screenshot at %s (%d bytes, %v)", shot, len(png), err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	// Let the stuck order through; it is applied, then the instance stops
	// cleanly.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitApplied(301, time.Minute)
	if code, _ := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("orders exited %d after SIGTERM, want 0", code)
	}
}

// sameValues reports whether a and b agree on what the test compares
// with the rendered page.
func sameValues(a, b status.Doc) bool {
	if len(a.Partitions) != len(b.Partitions) || a.Member.MemberID != b.Member.MemberID || a.Member.Generation != b.Member.Generation {
		return false
	}
	for i, p := range a.Partitions {
		q := b.Partitions[i]
		if p.Committed != q.Committed || p.HighWatermark != q.HighWatermark || p.DeadLettered != q.DeadLettered ||
			(p.Lag == nil) != (q.Lag == nil) || (p.Lag != nil && *p.Lag != *q.Lag) {
			return false
		}
	}
	return true
}

// partitionRows parses the rendered partitions table: per partition of
// topic, its cells' inner HTML by the column's header.
func partitionRows(t *testing.T, dom, topic string) map[int32]map[string]string {
	t.Helper()
	table := regexp.MustCompile(`(?s)<table id="partitions">(.*?)</table>`).FindStringSubmatch(dom)
	if table == nil {
		t.Fatalf("the rendered page has no partitions table:\n%s", dom)
	}
	var cols []string
	for _, m := range regexp.MustCompile(`<th[^>]*>([^<]*)</th>`).FindAllStringSubmatch(table[1], -1) {
		cols = append(cols, m[1])
	}
	rows := map[int32]map[string]string{}
	cell := regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`)
	for _, m := range regexp.MustCompile(`(?s)<tr class="(?:paused)?" data-partition="`+regexp.QuoteMeta(topic)+`/(\d+)">(.*?)</tr>`).FindAllStringSubmatch(table[1], -1) {
		cells := cell.FindAllStringSubmatch(m[2], -1)
		if len(cells) != len(cols) {
			t.Fatalf("partition %s's row has %d cells for %d columns: %s", m[1], len(cells), len(cols), m[0])
		}
		row := map[string]string{}
		for i, c := range cells {
			row[cols[i]] = strings.TrimSpace(c[1])
		}
		var n int32
		fmt.Sscan(m[1], &n)
		rows[n] = row
	}
	return rows
}

// ready reports whether d shows partition 0's stuck record running,
// partition 1's dead letter and partition 2 paused by the operator.
func ready(d status.Doc) bool {
	var n int
	for _, p := range d.Partitions {
		switch {
		case p.Partition == 0 && p.Oldest != nil && p.Oldest.State == "running" && p.Oldest.Key == "<b>stuck</b>":
			n++
		case p.Partition == 1 && p.DeadLettered >= 1:
			n++
		case p.Partition == 2 && p.Paused && strings.Contains(strings.Join(p.PausedBy, ","), "operator"):
			n++
		}
	}
	return n == 3
}
