package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// The files of deploy/ whose queries TestMetricsServeWhatDeployQueries
// checks, relative to this package.
const (
	rulesFile     = "../../deploy/prometheus/tidemark.rules.yml"
	dashboardFile = "../../deploy/grafana/tidemark.json"
)

// TestMetricsServeWhatDeployQueries: every metric and label that the alert
// rules and the dashboard of deploy/ query is in what the service serves
// on /metrics — newMetrics' handler and meter provider, as main uses them,
// under a real runner over kfake driven through each event the queries
// count: records handled, one retried, one dead-lettered, one fenced, a
// commit that fails, a partition paused by flow control, readiness. A
// renamed instrument, attribute or unit, or an exporter that stops
// escaping names to underscores, leaves a name of deploy/ unserved, and
// the test names it. Prometheus' own up is the one name left out.
func TestMetricsServeWhatDeployQueries(t *testing.T) {
	metrics, labels := deployQueries(t)
	t.Logf("deploy/ queries %d metrics: %s; labels: %s", len(metrics), strings.Join(metrics, " "), strings.Join(labels, " "))
	// A floor, so that a broken extraction cannot pass on nothing.
	if len(metrics) < 15 {
		t.Fatalf("found only %d metric names in %s and %s: the extraction is broken", len(metrics), rulesFile, dashboardFile)
	}

	handler, mp, err := newMetrics()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	c := kafkatest.NewFake(t)
	c.CreateTopic("orders", 2)
	c.CreateTopic("orders.dlq", 2)
	failCommits(t, c, "g")

	// Partition 0: one record of each fate. Partition 1: a record that
	// holds its key until the test ends, and the same key's records
	// queued behind it, over the high water mark: a pause.
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	var mu sync.Mutex
	attempts := map[int64]int{}
	handle := func(ctx context.Context, rec runner.Record) error {
		switch string(rec.Value) {
		case "retry":
			mu.Lock()
			attempts[rec.Offset]++
			n := attempts[rec.Offset]
			mu.Unlock()
			if n == 1 {
				return fmt.Errorf("order %s: the first attempt fails", rec.String())
			}
		case "bad":
			return runner.Permanent(fmt.Errorf("order %s: %w", rec.String(), errMalformed))
		case "fence":
			return fmt.Errorf("order %s: %w", rec.String(), runner.ErrFenced)
		case "hold":
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	src, err := franz.New(c.Brokers(), "g", []string{"orders"}, franz.Logger(kafkatest.Logger(t)),
		franz.SessionTimeout(3*time.Second), franz.HeartbeatInterval(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := kafkatest.Start(t, "", src, 10*time.Second,
		runner.Handle("orders", handle),
		runner.Failure(runner.DeadLetter("orders.dlq", 5, nil)),
		runner.Backoff(time.Millisecond, 10*time.Millisecond),
		runner.CommitInterval(50*time.Millisecond),
		runner.WaterMarks(4, 2),
		runner.Logger(kafkatest.Logger(t)),
		runner.MeterProvider(mp))
	// The handler is released before the member stops (cleanups run last
	// in first out): its drain would otherwise wait for it.
	t.Cleanup(unblock)
	probes := shutdown.NewProbes(m.Runner, 15*time.Second)
	if err := observeReady(mp, "g", probes.Ready); err != nil {
		t.Fatal(err)
	}
	probes.Started()

	var recs []*kgo.Record
	for i, v := range []string{"ok", "retry", "bad", "ok", "fence"} {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: 0, Key: fmt.Appendf(nil, "k%d", i), Value: []byte(v)})
	}
	recs = append(recs, &kgo.Record{Topic: "orders", Partition: 1, Key: []byte("held"), Value: []byte("hold")})
	for range 12 {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: 1, Key: []byte("held"), Value: []byte("ok")})
	}
	c.Produce(recs...)

	var text string
	missing := func() []string {
		var out []string
		for _, sc := range scrapers {
			var served map[string]map[string]bool
			text, served = scrape(t, handler, sc.accept)
			anyLabel := map[string]bool{}
			for _, ls := range served {
				maps.Copy(anyLabel, ls)
			}
			for _, n := range metrics {
				if served[n] == nil {
					out = append(out, n+" ("+sc.name+")")
				}
			}
			for _, l := range labels {
				if !anyLabel[l] {
					out = append(out, "label "+l+" ("+sc.name+")")
				}
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(missing()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if miss := missing(); len(miss) > 0 {
		t.Fatalf("/metrics does not serve %d names that deploy/ queries: %s\n(the rules in %s and the dashboard %s must follow a renamed instrument)\n/metrics:\n%s",
			len(miss), strings.Join(miss, ", "), rulesFile, dashboardFile, text)
	}
	// The gauge follows the probes: 1 while ready, 0 once draining.
	if got := sampleValue(text, "tidemark_ready"); got != "1" {
		t.Errorf("tidemark_ready = %q while the probes are ready; want 1", got)
	}
	probes.Draining()
	text, _ = scrape(t, handler, scrapers[0].accept)
	if got := sampleValue(text, "tidemark_ready"); got != "0" {
		t.Errorf("tidemark_ready = %q once the probes are draining; want 0", got)
	}
}

// scrapers are the Accept headers of the scrapes: Prometheus 2's, and
// Prometheus 3's, which accepts UTF-8 names and gets them from an exporter
// that writes them.
var scrapers = []struct{ name, accept string }{
	{"Prometheus 2", "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"},
	{"Prometheus 3", "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,*/*;q=0.1"},
}

// failCommits makes the cluster answer the first two OffsetCommits of group
// with an error for every partition (OFFSET_METADATA_TOO_LARGE, which
// franz-go hands back without retrying): tidemark.commit.failures counts
// them, and the next commits go through.
func failCommits(t *testing.T, c *kafkatest.Cluster, group string) {
	var mu sync.Mutex
	failed := 0
	c.Fake.ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.Fake.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		mu.Lock()
		defer mu.Unlock()
		if req.Group != group || failed >= 2 {
			return nil, nil, false
		}
		failed++
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.SetVersion(req.GetVersion())
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// scrape GETs /metrics from h and returns the text and, per sample name
// (a histogram's _bucket, _sum and _count each), the label names its
// samples carry.
func scrape(t *testing.T, h http.Handler, accept string) (string, map[string]map[string]bool) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", accept)
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("GET /metrics (Accept: %s): %d\n%s", accept, rec.Code, rec.Body)
	}
	text := rec.Body.String()
	served := map[string]map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, lbls, hasLabels := strings.Cut(line, "{")
		if !hasLabels {
			name, _, _ = strings.Cut(line, " ")
		}
		if served[name] == nil {
			served[name] = map[string]bool{}
		}
		if hasLabels {
			for _, m := range sampleLabel.FindAllStringSubmatch(lbls, -1) {
				served[name][m[1]] = true
			}
		}
	}
	return text, served
}

var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// sampleValue returns the value of name's first sample in text, or "".
func sampleValue(text, name string) string {
	for line := range strings.Lines(text) {
		if n, _, _ := strings.Cut(line, "{"); n == name {
			f := strings.Fields(line)
			return f[len(f)-1]
		}
	}
	return ""
}

// deployQueries returns the metric names and the label names (sorted)
// that the expressions of the rules file and the queries of the dashboard
// (its panels' and its variables') use, less up, job and instance, which
// Prometheus adds. The rules file is read as this repository writes it:
// each expression an "expr:" line, alone or followed by an indented block.
func deployQueries(t *testing.T) (metrics, labels []string) {
	t.Helper()
	var exprs []string
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(rules), "\n")
	alerts := 0
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if strings.HasPrefix(trimmed, "- alert:") {
			alerts++
		}
		e, ok := strings.CutPrefix(trimmed, "expr:")
		if !ok {
			continue
		}
		if e = strings.TrimSpace(e); e != "|" && e != ">" && e != "|-" && e != ">-" {
			exprs = append(exprs, e)
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var block []string
		for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent) {
			i++
			block = append(block, lines[i])
		}
		exprs = append(exprs, strings.Join(block, "\n"))
	}
	if alerts == 0 || len(exprs) != alerts {
		t.Fatalf("%s: %d alerts and %d expressions read: the file is not written as this test reads it", rulesFile, alerts, len(exprs))
	}

	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Type  string
				Query json.RawMessage
			}
		}
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" {
				t.Errorf("%s: panel %q has a query without expr", dashboardFile, p.Title)
			}
			exprs = append(exprs, q.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: a variable's query: %v", dashboardFile, err)
		}
		// label_values(selector, label)
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("%s: variable query %q is not label_values(metric, label)", dashboardFile, q.Query)
		}
		exprs = append(exprs, m[1], "x by ("+m[2]+")")
	}

	ms, ls := map[string]bool{}, map[string]bool{}
	for _, e := range exprs {
		promqlNames(e, ms, ls)
	}
	delete(ms, "up")
	delete(ms, "x")
	delete(ls, "job")
	delete(ls, "instance")
	return slices.Sorted(maps.Keys(ms)), slices.Sorted(maps.Keys(ls))
}

var (
	labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	// Strings, Grafana's variables, and durations (5m) hold no names.
	promqlNoise = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\$\{?\w+\}?|\b\d+[smhdwy]\b`)
	// A selector's label matchers, {a="x", b=~"y"} (strings gone).
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	// by (a, b), without (...), on (...), ignoring (...), group_left (...).
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlWord     = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b\s*\(?`)
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true}
)

// promqlNames adds the metric names of the PromQL expression e to metrics
// and the label names it matches or groups by to labels. It knows as much
// PromQL as deploy/ uses: selectors with matchers, functions and
// aggregations (a word followed by "("), grouping clauses, binary
// operators, numbers and durations.
func promqlNames(e string, metrics, labels map[string]bool) {
	e = promqlNoise.ReplaceAllString(e, "")
	e = promqlMatchers.ReplaceAllStringFunc(e, func(m string) string {
		for _, l := range promqlIdent.FindAllString(m, -1) {
			labels[l] = true
		}
		return " "
	})
	e = promqlGrouping.ReplaceAllStringFunc(e, func(m string) string {
		inner := promqlGrouping.FindStringSubmatch(m)[1]
		for _, l := range promqlIdent.FindAllString(inner, -1) {
			labels[l] = true
		}
		return " "
	})
	for _, w := range promqlWord.FindAllString(e, -1) {
		w = strings.TrimSpace(w)
		if strings.HasSuffix(w, "(") || promqlKeywords[w] {
			continue // a function or an aggregation, or an operator
		}
		metrics[w] = true
	}
}
