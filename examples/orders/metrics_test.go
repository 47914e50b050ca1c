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
	rulesTestFile = "../../deploy/prometheus/tidemark.rules.test.yml"
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
//
// Each selector is checked against its own metric: every label it
// matches, and every label an aggregation groups it by, must be one that
// metric's samples carry (or job and instance, which Prometheus adds), so
// tidemark_partitions_pauses_total{messaging_consumer_group_name=~"$group"}
// fails, that counter having no group. And each query of the dashboard
// must filter by every variable of the dashboard whose label its metric
// carries (instance: every metric), as docs/operations.md says they do.
func TestMetricsServeWhatDeployQueries(t *testing.T) {
	queries, vars := deployQueries(t)
	metrics, labels := queryNames(queries)
	t.Logf("deploy/ queries %d metrics: %s", len(metrics), strings.Join(metrics, " "))
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

	var (
		text   string
		served map[string]map[string]bool
	)
	missing := func() []string {
		var out []string
		for _, sc := range scrapers {
			text, served = scrape(t, handler, sc.accept)
			for _, n := range metrics {
				if served[n] == nil {
					out = append(out, n+" ("+sc.name+")")
				}
			}
			for _, q := range queries {
				for _, miss := range unservedLabels(q, served) {
					out = append(out, miss+" ("+sc.name+")")
				}
			}
		}
		return out
	}
	// A poll, not a wait on a signal: what it waits for is the runner's
	// state after franz-go's client, over TCP to kfake, has delivered the
	// records, failed two commits on its commit interval and paused a
	// partition; half of the instruments are observable gauges whose value
	// exists only when /metrics collects them, and pkg/runner has no hook
	// that says an instrument was recorded. testing/synctest cannot hold
	// the client's and kfake's network I/O in a bubble.
	deadline := time.Now().Add(30 * time.Second)
	for len(missing()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if miss := missing(); len(miss) > 0 {
		t.Fatalf("/metrics does not serve %d metrics or labels that deploy/ queries: %s\n(the rules in %s and the dashboard %s must follow a renamed instrument)\n/metrics:\n%s",
			len(miss), strings.Join(miss, ", "), rulesFile, dashboardFile, text)
	}
	// Every query of the dashboard filters by each variable whose label
	// its metric has.
	for _, q := range queries {
		if !q.panel {
			continue
		}
		for _, miss := range unfilteredVars(q, vars, served) {
			t.Errorf("%s", miss)
		}
	}
	if len(vars) < 3 {
		t.Errorf("%s: %d variables read (%v); the dashboard has group, topic and instance", dashboardFile, len(vars), vars)
	}
	t.Logf("labels: %s", strings.Join(labels, " "))

	// The promtool tests feed the rules the series the exporter writes.
	text, _ = scrape(t, handler, scrapers[0].accept)
	for _, miss := range unlikeTestSeries(t, text) {
		t.Errorf("%s: %s", rulesTestFile, miss)
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

var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

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

// query is a PromQL expression of deploy/ and where it is.
type query struct {
	where, expr string
	panel       bool // a query of a dashboard panel
}

// variable is a query variable of the dashboard and the label it takes
// its values from.
type variable struct{ name, label string }

// deployQueries returns the expressions of the rules file and the queries
// of the dashboard (its panels' and its variables'), and the dashboard's
// query variables. The rules file is read as this repository writes it:
// each expression an "expr:" line, alone or followed by an indented block.
func deployQueries(t *testing.T) ([]query, []variable) {
	t.Helper()
	var (
		exprs []query
		vars  []variable
	)
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
			exprs = append(exprs, query{where: fmt.Sprintf("%s:%d", rulesFile, i+1), expr: e})
			continue
		}
		start := i + 1
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var block []string
		for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent) {
			i++
			block = append(block, lines[i])
		}
		exprs = append(exprs, query{where: fmt.Sprintf("%s:%d", rulesFile, start), expr: strings.Join(block, "\n")})
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
				Name  string
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
			exprs = append(exprs, query{where: fmt.Sprintf("%s: panel %q", dashboardFile, p.Title), expr: q.Expr, panel: true})
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
		// label_values(m, l) lists the values of l on the series of m:
		// as m grouped by l.
		exprs = append(exprs, query{where: fmt.Sprintf("%s: variable %q", dashboardFile, v.Name), expr: "max by (" + m[2] + ") (" + m[1] + ")"})
		vars = append(vars, variable{name: v.Name, label: m[2]})
	}
	return exprs, vars
}

// queryNames are the metric names and the label names (sorted) that
// queries use, less up, job and instance, which Prometheus adds.
func queryNames(queries []query) (metrics, labels []string) {
	ms, ls := map[string]bool{}, map[string]bool{}
	for _, q := range queries {
		promqlNames(q.expr, ms, ls)
	}
	delete(ms, "up")
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

// selector is a metric name of a PromQL expression and its label
// matchers, label → value ("$group" for =~"$group").
type selector struct {
	name     string
	matchers map[string]string
}

var (
	// A selector with matchers: name{a="x", b=~"y"}; a value may hold "}".
	promqlSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}`)
	promqlMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	// An aggregation's leading "by (labels) (": the form deploy/ writes.
	promqlBy = regexp.MustCompile(`\bby\s*\(([^)]*)\)\s*\(`)
	// The trailing form, sum(x) by (l), which this test does not read.
	promqlTrailingBy = regexp.MustCompile(`\)\s*(?:by|without)\s*\(`)
)

// selectors returns the selectors of e: those with matchers, then the
// bare metric names (promqlNames' words), without matchers. Its limits,
// which deploy/ keeps within: no {__name__=...} selector, no matcher
// value with an unescaped quote.
func selectors(e string) ([]selector, error) {
	var out []selector
	var errs []string
	rest := promqlSelector.ReplaceAllStringFunc(e, func(m string) string {
		sm := promqlSelector.FindStringSubmatch(m)
		if sm[1] == "" {
			errs = append(errs, fmt.Sprintf("a selector without a metric name: %s", m))
			return " "
		}
		sel := selector{name: sm[1], matchers: map[string]string{}}
		for _, mm := range promqlMatcher.FindAllStringSubmatch(sm[2], -1) {
			sel.matchers[mm[1]] = mm[2]
		}
		out = append(out, sel)
		return " "
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	bare := map[string]bool{}
	promqlNames(rest, bare, map[string]bool{})
	for _, n := range slices.Sorted(maps.Keys(bare)) {
		out = append(out, selector{name: n, matchers: map[string]string{}})
	}
	return out, nil
}

// groupings returns, for each "by (labels) (inner)" of e, the labels and
// the selectors of inner. A trailing "(...) by (labels)" is an error: this
// test would not know what it groups.
func groupings(e string) (labels [][]string, inner [][]selector, err error) {
	if m := promqlTrailingBy.FindString(e); m != "" {
		return nil, nil, fmt.Errorf("a trailing grouping %q: write it before the aggregation's argument, as deploy/ does", m)
	}
	for _, ix := range promqlBy.FindAllStringSubmatchIndex(e, -1) {
		open := ix[1] - 1 // the "(" of the argument
		end, depth, quoted := -1, 0, false
		for i := open; i < len(e) && end < 0; i++ {
			switch c := e[i]; {
			case quoted && c == '\\':
				i++
			case c == '"':
				quoted = !quoted
			case quoted:
			case c == '(':
				depth++
			case c == ')':
				if depth--; depth == 0 {
					end = i
				}
			}
		}
		if end < 0 {
			return nil, nil, fmt.Errorf("an unbalanced aggregation at %q", e[ix[0]:])
		}
		sels, err := selectors(e[open+1 : end])
		if err != nil {
			return nil, nil, err
		}
		labels = append(labels, promqlIdent.FindAllString(e[ix[2]:ix[3]], -1))
		inner = append(inner, sels)
	}
	return labels, inner, nil
}

// hasLabel says whether the samples of metric carry label; Prometheus adds
// job and instance to every series, and up has no others.
func hasLabel(served map[string]map[string]bool, metric, label string) bool {
	return label == "job" || label == "instance" || served[metric][label]
}

// unservedLabels lists what q asks of a metric that its samples, as
// served, do not have: a matcher's label, or a label an aggregation
// groups it by.
func unservedLabels(q query, served map[string]map[string]bool) []string {
	var out []string
	sels, err := selectors(q.expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", q.where, err)}
	}
	for _, s := range sels {
		for _, l := range slices.Sorted(maps.Keys(s.matchers)) {
			if !hasLabel(served, s.name, l) {
				out = append(out, fmt.Sprintf("%s: %s has no label %s", q.where, s.name, l))
			}
		}
	}
	labels, inner, err := groupings(q.expr)
	if err != nil {
		return append(out, fmt.Sprintf("%s: %v", q.where, err))
	}
	for i := range labels {
		for _, s := range inner[i] {
			for _, l := range labels[i] {
				if l != "le" || strings.HasSuffix(s.name, "_bucket") { // le: a histogram's buckets only
					if !hasLabel(served, s.name, l) {
						out = append(out, fmt.Sprintf("%s: grouped by %s, which %s has not", q.where, l, s.name))
					}
				} else {
					out = append(out, fmt.Sprintf("%s: grouped by le, which %s (no _bucket) has not", q.where, s.name))
				}
			}
		}
	}
	return out
}

// unfilteredVars lists the variables of the dashboard that the panel query
// q does not filter by (label=~"$name") on a metric that has their label.
func unfilteredVars(q query, vars []variable, served map[string]map[string]bool) []string {
	var out []string
	sels, err := selectors(q.expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", q.where, err)}
	}
	for _, s := range sels {
		for _, v := range vars {
			if !hasLabel(served, s.name, v.label) {
				continue
			}
			if got := s.matchers[v.label]; got != "$"+v.name && got != "${"+v.name+"}" {
				out = append(out, fmt.Sprintf("%s: %s is not filtered by $%s (%s=~\"$%s\"), though it has %s", q.where, s.name, v.name, v.label, v.name, v.label))
			}
		}
	}
	return out
}

// TestPromQLLabelChecks: the checks above fail on what they are for — a
// matcher or a grouping label that the named metric lacks though another
// metric has it, and a panel query that leaves out a variable its metric
// could be filtered by — and pass on what deploy/ writes.
func TestPromQLLabelChecks(t *testing.T) {
	group, topic := "messaging_consumer_group_name", "messaging_destination_name"
	// As /metrics serves them: the pauses counter has no group (pkg/runner
	// records it without attributes).
	served := map[string]map[string]bool{
		"tidemark_partitions_pauses_total":        {"otel_scope_name": true},
		"tidemark_consumer_lag":                   {group: true, topic: true},
		"tidemark_records_in_flight":              {group: true},
		"tidemark_commit_duration_seconds_bucket": {group: true, "le": true},
	}
	vars := []variable{{"group", group}, {"topic", topic}, {"instance", "instance"}}
	for _, tt := range []struct {
		expr             string
		labels, unfilter int // problems each check finds
	}{
		{`sum by (instance) (rate(tidemark_partitions_pauses_total{messaging_consumer_group_name=~"$group", instance=~"$instance"}[5m]))`, 1, 0},
		{`sum by (instance) (rate(tidemark_partitions_pauses_total{instance=~"$instance"}[5m]))`, 0, 0},
		{`sum by (instance) (rate(tidemark_partitions_pauses_total[5m]))`, 0, 1},
		{`sum by (messaging_destination_name) (tidemark_records_in_flight{messaging_consumer_group_name=~"$group", instance=~"$instance"})`, 1, 0},
		{`max by (messaging_destination_name) (tidemark_consumer_lag{messaging_consumer_group_name=~"$group", instance=~"$instance"})`, 0, 1},
		{`max by (messaging_destination_name) (tidemark_consumer_lag{messaging_consumer_group_name=~"$group", messaging_destination_name=~"$topic", instance=~"$instance"})`, 0, 0},
		{`histogram_quantile(0.9, sum by (le) (rate(tidemark_commit_duration_seconds_bucket{messaging_consumer_group_name=~"$group", instance=~"${instance}"}[5m])))`, 0, 0},
		{`sum(tidemark_records_in_flight) by (instance)`, 1, 2},
	} {
		q := query{where: "q", expr: tt.expr, panel: true}
		if got := unservedLabels(q, served); len(got) != tt.labels {
			t.Errorf("unservedLabels(%s) = %q, want %d", tt.expr, got, tt.labels)
		}
		if got := unfilteredVars(q, vars, served); len(got) != tt.unfilter {
			t.Errorf("unfilteredVars(%s) = %q, want %d", tt.expr, got, tt.unfilter)
		}
	}
}

// seriesLabels parses the labels of a sample line or a series
// (name{a="x",...}) into name and label → value.
func seriesLabels(line string) (string, map[string]string) {
	name, rest, _ := strings.Cut(line, "{")
	name, _, _ = strings.Cut(name, " ")
	ls := map[string]string{}
	if i := strings.LastIndex(rest, "}"); i >= 0 {
		for _, m := range sampleLabel.FindAllStringSubmatch(rest[:i], -1) {
			ls[m[1]] = m[2]
		}
	}
	return name, ls
}

var testSeries = regexp.MustCompile(`(?m)^\s*- series:\s*'([^']*)'`)

// unlikeTestSeries lists how the input series of the promtool rule tests
// differ from what /metrics serves (text): each must be a served metric,
// carry every label that each of its served samples carries with a value
// (an empty one Prometheus drops), the otel_scope_* ones with the served
// value, and no label that none carries, but job and instance. up, which
// Prometheus writes, is left out.
func unlikeTestSeries(t *testing.T, text string) []string {
	t.Helper()
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string][]map[string]string{}
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); line == "" || line[0] == '#' {
			continue
		}
		name, ls := seriesLabels(line)
		maps.DeleteFunc(ls, func(_, v string) bool { return v == "" })
		served[name] = append(served[name], ls)
	}
	var out []string
	found := testSeries.FindAllStringSubmatch(string(raw), -1)
	if len(found) < 10 {
		t.Fatalf("%s: %d input series read: the file is not written as this test reads it", rulesTestFile, len(found))
	}
	for _, m := range found {
		name, ls := seriesLabels(m[1])
		if name == "up" {
			continue
		}
		samples := served[name]
		if len(samples) == 0 {
			out = append(out, fmt.Sprintf("%s is no metric /metrics serves", m[1]))
			continue
		}
		any := map[string]bool{"job": true, "instance": true}
		for _, s := range samples {
			for l := range s {
				any[l] = true
			}
		}
		for l, v := range samples[0] {
			every := !slices.ContainsFunc(samples, func(s map[string]string) bool { return s[l] == "" })
			switch {
			case !every:
			case ls[l] == "":
				out = append(out, fmt.Sprintf("%s lacks %s=%q, which every sample of %s carries", m[1], l, v, name))
			case strings.HasPrefix(l, "otel_scope_") && ls[l] != v:
				out = append(out, fmt.Sprintf("%s has %s=%q; /metrics serves %q", m[1], l, ls[l], v))
			}
		}
		for _, l := range slices.Sorted(maps.Keys(ls)) {
			if !any[l] {
				out = append(out, fmt.Sprintf("%s has %s, which no sample of %s carries", m[1], l, name))
			}
		}
	}
	return out
}
