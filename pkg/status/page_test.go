package status_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/status"
)

// fake is a Runner with fixed stats that records the controls' calls.
type fake struct {
	stats runner.Stats
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fake) Stats() runner.Stats { return f.stats }
func (f *fake) OperatorPaused() runner.OperatorPauses {
	return runner.OperatorPauses{Topics: []string{"orders"}, Partitions: []runner.TP{{Topic: "other", Partition: 2}}}
}
func (f *fake) call(s string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
	return f.err
}
func (f *fake) PausePartitions(_ context.Context, tps ...runner.TP) error {
	return f.call(fmt.Sprint("pause ", tps))
}
func (f *fake) ResumePartitions(_ context.Context, tps ...runner.TP) error {
	return f.call(fmt.Sprint("resume ", tps))
}
func (f *fake) PauseTopics(_ context.Context, topics ...string) error {
	return f.call(fmt.Sprint("pause topics ", topics))
}
func (f *fake) ResumeTopics(_ context.Context, topics ...string) error {
	return f.call(fmt.Sprint("resume topics ", topics))
}
func (f *fake) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

const evilKey = `"<script>alert(1)</script>\xff"`

func newFake() *fake {
	at := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	return &fake{stats: runner.Stats{
		LoopAt: at, InFlight: 3, Buffered: 10,
		Member: runner.MemberStats{Group: "orders", Joined: true,
			MemberInfo: runner.MemberInfo{MemberID: "m-1", Generation: 7, ContactAt: at},
			Rebalances: []runner.Rebalance{
				{At: at.Add(-time.Minute), Kind: "assigned", Generation: 6, Partitions: []runner.TP{{Topic: "orders", Partition: 1}}},
				{At: at, Kind: "revoked", Generation: 6, Took: 150 * time.Millisecond, Partitions: []runner.TP{{Topic: "orders", Partition: 1}}},
			}},
		Partitions: []runner.PartitionStats{
			{TP: runner.TP{Topic: "orders", Partition: 1}, Safe: 90, Acknowledged: 80, HighWatermark: 120, Fetched: 99,
				Buffered: 10, InFlight: 3, Paused: true, PausedBy: runner.PausedOperator | runner.PausedWindow, Lanes: 3,
				DeadLettered: 2, Fenced: 1, Outstanding: 19,
				OldestOffset: 90, OldestAge: 90 * time.Second, OldestState: runner.Retrying, OldestAttempts: 4,
				OldestKey: evilKey, OldestError: "db said <script>steal()</script> \xfe\xff"},
			{TP: runner.TP{Topic: "orders", Partition: 0}, Safe: -1, Acknowledged: -1, HighWatermark: -1, Fetched: -1, OldestOffset: -1},
		},
	}}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// local makes a path a URL on a loopback address: httptest's default
// Host, example.com, is a DNS name the page refuses (see TestHosts).
func local(path string) string {
	if strings.HasPrefix(path, "/") {
		return "http://127.0.0.1:8081" + path
	}
	return path
}

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", local(path), nil))
	return rec.Result(), rec.Body.String()
}

// TestPageEscapesUserBytes: a key and an error holding markup and invalid
// UTF-8 are shown escaped, as valid UTF-8; the page carries no script.
func TestPageEscapesUserBytes(t *testing.T) {
	res, body := get(t, status.New(newFake()).Handler(), "/tidemark")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /tidemark: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if strings.Contains(strings.ToLower(body), "<script") {
		t.Fatalf("the page carries a <script> element:\n%s", body)
	}
	if !utf8.ValidString(body) {
		t.Fatal("the page is not valid UTF-8")
	}
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "db said &lt;script&gt;steal()&lt;/script&gt; \uFFFD",
		`<td class="offset">90</td>`, `<td class="l state">retrying</td>`, "1m30s", `data-partition="orders/1"`,
		"paused <span class=\"cause\">window</span> <span class=\"cause\">operator</span>", "m-1", "revoked", "Controls are off."} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q allows scripts", csp)
	}
	// Partitions sorted: orders/0 before orders/1.
	if i, j := strings.Index(body, `data-partition="orders/0"`), strings.Index(body, `data-partition="orders/1"`); i < 0 || i > j {
		t.Errorf("partitions out of order (orders/0 at %d, orders/1 at %d)", i, j)
	}
	_, hidden := get(t, status.New(newFake(), status.HideKeys()).Handler(), "/tidemark")
	if strings.Contains(hidden, "alert(1)") || !strings.Contains(hidden, "(hidden)") {
		t.Error("HideKeys: the key is still shown")
	}
}

// TestPageJSON: the document's figures.
func TestPageJSON(t *testing.T) {
	res, body := get(t, status.New(newFake()).Handler(), "/tidemark.json")
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /tidemark.json: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	var d status.Doc
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Partitions) != 2 {
		t.Fatalf("%d partitions, want 2", len(d.Partitions))
	}
	p0, p1 := d.Partitions[0], d.Partitions[1]
	if p0.Partition != 0 || p0.Lag != nil || p0.Oldest != nil {
		t.Errorf("orders/0 %+v: want lag unknown and no oldest record", p0)
	}
	if p1.Lag == nil || *p1.Lag != 40 || p1.Committed != 80 || p1.Safe != 90 || p1.Fetched != 99 || p1.Queued != 7 ||
		p1.InFlight != 3 || p1.Lanes != 3 || p1.DeadLettered != 2 || p1.Fenced != 1 || !slices.Equal(p1.PausedBy, []string{"window", "operator"}) {
		t.Errorf("orders/1 %+v", p1)
	}
	if o := p1.Oldest; o == nil || o.Offset != 90 || o.Key != strings.ToValidUTF8(evilKey, "\uFFFD") || o.State != "retrying" ||
		o.Attempts != 4 || o.AgeSeconds != 90 {
		t.Errorf("oldest %+v", p1.Oldest)
	}
	if m := d.Member; m.MemberID != "m-1" || m.Generation != 7 || len(m.Rebalances) != 2 || m.Rebalances[0].Kind != "revoked" {
		t.Errorf("member %+v: want the revoke first (newest first)", m)
	}
	if !slices.Equal(d.OperatorPaused.Topics, []string{"orders"}) || !slices.Equal(d.OperatorPaused.Partitions, []string{"other/2"}) {
		t.Errorf("operator pauses %+v", d.OperatorPaused)
	}
}

func post(h http.Handler, path string, form url.Values, hdr map[string]string) *http.Response {
	req := httptest.NewRequest("POST", local(path), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

// TestControls: off by default; when on, pause and resume a topic or a
// partition; bad input, cross-origin browser requests and GET are refused
// and change nothing.
func TestControls(t *testing.T) {
	f := newFake()
	off := status.New(f).Handler()
	if res := post(off, "/tidemark/pause", url.Values{"topic": {"orders"}}, nil); res.StatusCode != http.StatusForbidden {
		t.Fatalf("controls off: POST pause answered %d, want 403", res.StatusCode)
	}
	h := status.New(f, status.Controls(true)).Handler()
	for _, c := range []struct {
		path string
		form url.Values
		hdr  map[string]string
		code int
	}{
		{"/tidemark/pause", url.Values{"topic": {"orders"}}, nil, 200},
		{"/tidemark/pause", url.Values{"topic": {"orders"}, "partition": {"3"}}, map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
		{"/tidemark/resume", url.Values{"topic": {"orders"}, "partition": {"3"}, "from": {"page"}}, nil, http.StatusSeeOther},
		{"/tidemark/resume", url.Values{"topic": {"orders"}}, nil, 200},
		{"/tidemark/pause", url.Values{"topic": {"orders"}, "partition": {"x"}}, nil, 400},
		{"/tidemark/pause", url.Values{"topic": {"orders"}, "partition": {"-1"}}, nil, 400},
		{"/tidemark/pause", url.Values{}, nil, 400},
		{"/tidemark/pause", url.Values{"topic": {"orders"}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"/tidemark/pause", url.Values{"topic": {"orders"}}, map[string]string{"Origin": "https://evil.example"}, 403},
	} {
		if res := post(h, c.path, c.form, c.hdr); res.StatusCode != c.code {
			b, _ := io.ReadAll(res.Body)
			t.Errorf("POST %s %v %v: %d %s, want %d", c.path, c.form, c.hdr, res.StatusCode, b, c.code)
		}
	}
	if res, _ := get(t, h, "/tidemark/pause?topic=orders"); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /tidemark/pause answered %d, want 405", res.StatusCode)
	}
	want := []string{"pause topics [orders]", "pause [orders/3]", "resume [orders/3]", "resume topics [orders]"}
	if got := f.got(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	f.err = fmt.Errorf("runner: pause topic %q: %w", "nope", runner.ErrNotHandled)
	if res := post(h, "/tidemark/pause", url.Values{"topic": {"nope"}}, nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("a topic without a handler: %d, want 404", res.StatusCode)
	}
	f.err = runner.ErrStopped
	if res := post(h, "/tidemark/pause", url.Values{"topic": {"orders"}}, nil); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a stopped runner: %d, want 503", res.StatusCode)
	}
	f.err = errors.New("runner: resume partition orders/1: its topic is paused as a whole")
	if res := post(h, "/tidemark/resume", url.Values{"topic": {"orders"}, "partition": {"1"}}, nil); res.StatusCode != http.StatusConflict {
		t.Errorf("a refused resume: %d, want 409", res.StatusCode)
	}
}

// TestPageUnderAPrefix: mounted under a path prefix (a proxy's /ops/), the
// page's forms post to, and the redirect after a pause comes back to, URLs
// under the prefix.
func TestPageUnderAPrefix(t *testing.T) {
	h := http.StripPrefix("/ops", status.New(newFake(), status.Controls(true)).Handler())
	pageURL, _ := url.Parse("http://127.0.0.1:8081/ops/tidemark")
	_, body := get(t, h, pageURL.String())
	for n := range 3 { // the fake's paused topic's resume, then pause and resume
		i := strings.Index(body, `action="`)
		if i < 0 {
			t.Fatalf("no form on the page:\n%s", body)
		}
		body = body[i+len(`action="`):]
		ref, _ := url.Parse(body[:strings.IndexByte(body, '"')])
		if got := pageURL.ResolveReference(ref).Path; got != "/ops/tidemark/pause" && got != "/ops/tidemark/resume" {
			t.Errorf("form %d posts to %s, want under /ops/tidemark/", n, got)
		}
	}
	postURL, _ := url.Parse("http://127.0.0.1:8081/ops/tidemark/pause")
	res := post(h, postURL.String(), url.Values{"topic": {"orders"}, "from": {"page"}}, nil)
	loc, err := url.Parse(res.Header.Get("Location"))
	if res.StatusCode != http.StatusSeeOther || err != nil {
		t.Fatalf("POST from the page: %d, Location %q", res.StatusCode, res.Header.Get("Location"))
	}
	if got := postURL.ResolveReference(loc).Path; got != "/ops/tidemark" {
		t.Errorf("the redirect after a pause goes to %s, want /ops/tidemark", got)
	}
}
