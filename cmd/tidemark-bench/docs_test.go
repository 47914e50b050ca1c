package main

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the checkout's root, from this package's directory.
const root = "../.."

// TestDocsGenerated: the generated regions of docs/performance.md and
// docs/operations.md are what the generators make of the committed
// docs/bench/*.json, so a figure in the docs cannot drift from its report;
// every generator has a region.
func TestDocsGenerated(t *testing.T) {
	reps, err := readBenchReports(filepath.Join(root, "docs", "bench"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, name := range generatedDocs {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		got, regions, err := regenerate(string(b), reps)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, r := range regions {
			used[r] = true
		}
		if got != string(b) {
			t.Errorf("%s differs from docs/bench/*.json; run: go run ./cmd/tidemark-bench -write-docs .\n%s", name, lineDiff(string(b), got))
		}
	}
	for name := range generators {
		if !used[name] {
			t.Errorf("generator %q has no region in %v", name, generatedDocs)
		}
	}
}

// TestDocsCheckFails: a figure changed in a document, or in its report,
// makes the regenerated document differ — the check above can fail.
func TestDocsCheckFails(t *testing.T) {
	reps, err := readBenchReports(filepath.Join(root, "docs", "bench"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	edited := strings.Replace(doc, "79% at 1,024", "73% at 1,024", 1)
	if edited == doc {
		t.Fatal(`docs/operations.md has no "79% at 1,024" to edit`)
	}
	if got, _, _ := regenerate(edited, reps); got != doc {
		t.Errorf("a hand-edited figure is not put back:\n%s", lineDiff(doc, got))
	}
	cv := &reps.bench.Curves[slices.IndexFunc(reps.bench.Curves, func(c Curve) bool { return c.Name == "concurrency" })]
	cv.Points[len(cv.Points)-1].OfTheory = 0.73
	if got, _, _ := regenerate(doc, reps); got == doc || !strings.Contains(got, "73% at 1,024") {
		t.Error("a changed report does not change the document")
	}
}

func TestRegenerateErrors(t *testing.T) {
	reps, err := readBenchReports(filepath.Join(root, "docs", "bench"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ doc, want string }{
		{"a\n<!-- generated: nope -->x<!-- end -->\n", `line 2: no generator for region "nope"`},
		{"<!-- generated: bench-table -->\n| old |\n", `line 1: generated region "bench-table" has no <!-- end -->`},
		{"<!-- generated: bench-table\n", "without its closing -->"},
		{"<!-- generated: keys-curve --><!-- generated: keys-curve --><!-- end -->", "holds another one"},
	} {
		if _, _, err := regenerate(tt.doc, reps); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.doc, err, tt.want)
		}
	}
}

// lineDiff lists the lines of want and got that differ, after their common
// beginning and end.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	j := 0
	for j < len(w)-i && j < len(g)-i && w[len(w)-1-j] == g[len(g)-1-j] {
		j++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "from line %d:\n", i+1)
	for _, l := range w[i : len(w)-j] {
		b.WriteString("- " + l + "\n")
	}
	for _, l := range g[i : len(g)-j] {
		b.WriteString("+ " + l + "\n")
	}
	return b.String()
}

var (
	mdLink   = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// A code span that names a file or directory of the checkout: a
	// path under one of its top directories, or a file with an extension.
	pathLike = regexp.MustCompile(`^(\.\./|\./)?(pkg|cmd|docs|examples|scripts|integration|internal|deploy|\.ci)(/[A-Za-z0-9_.\-]+)*/?$|^(\.\./|\./)?([A-Za-z0-9_\-]+/)*[A-Za-z0-9_\-]+\.(go|md|json|png|txt|yml|yaml|sql|mod)$`)
)

// notFiles are code spans that look like a path of the checkout and are
// not one, with the reason.
var notFiles = map[string]string{
	"state.json":         "scripts/testbed's state, under .testbed/ at run time",
	"scripts/kafkaready": "docs/testbed.md says it was deleted",
}

// TestDocLinks: every relative link of README.md and docs/*.md leads to a
// file of the checkout (and, with #anchor into a markdown file, to one of
// its headings), and every file or directory of the checkout a code span
// names in their prose exists — a bare file name (`drain_test.go`)
// somewhere in the checkout, a path from the root or from the document:
// a renamed or deleted file shows up here.
func TestDocLinks(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{} // the base names of the checkout's files
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".testbed") {
			return filepath.SkipDir
		}
		names[d.Name()] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for n, line := range proseLines(string(b)) {
			if line == "" {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				if msg := checkLink(doc, m[1]); msg != "" {
					t.Errorf("%s:%d: link %s: %s", rel, n+1, m[1], msg)
				}
			}
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				ref := strings.TrimSuffix(m[1], "/...") // a package pattern
				if !pathLike.MatchString(ref) || notFiles[ref] != "" {
					continue
				}
				if !strings.Contains(ref, "/") {
					if !names[ref] {
						t.Errorf("%s:%d: `%s` is the name of no file of the checkout", rel, n+1, ref)
					}
					continue
				}
				if !exists(filepath.Join(root, ref)) && !exists(filepath.Join(filepath.Dir(doc), ref)) {
					t.Errorf("%s:%d: `%s` names no file of the checkout", rel, n+1, ref)
				}
			}
		}
	}
}

// proseLines is text's lines with those of fenced code blocks blanked
// (commands there name files they create), and HTML comments removed.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// checkLink returns what is wrong with the link target of doc, or "".
func checkLink(doc, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := doc
	if path != "" {
		file = filepath.Join(filepath.Dir(doc), path)
		if !exists(file) {
			return "no such file"
		}
	}
	if anchor == "" || !strings.HasSuffix(file, ".md") {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if !slices.Contains(headingSlugs(string(b)), anchor) {
		return fmt.Sprintf("no heading #%s in %s", anchor, filepath.Base(file))
	}
	return ""
}

// headingSlugs are the anchors GitHub gives text's headings: lower case,
// punctuation dropped, spaces turned into hyphens, -1, -2, … after a
// repeated one.
func headingSlugs(text string) []string {
	var slugs []string
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		s := b.String()
		if n := seen[s]; n > 0 {
			slugs = append(slugs, fmt.Sprintf("%s-%d", s, n))
		} else {
			slugs = append(slugs, s)
		}
		seen[s]++
	}
	return slugs
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestCheckLink: the link check finds a missing file and a missing
// heading, and takes GitHub's anchors.
func TestCheckLink(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "a.md")
	text := "# Title\n\n## 7. Exactly-once effects with the inbox\n\n### The lab: `tidemark lab offsets`\n\n## Title\n\n```\n# not a heading\n```\n"
	if err := os.WriteFile(doc, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ target, want string }{
		{"a.md", ""},
		{"#7-exactly-once-effects-with-the-inbox", ""},
		{"a.md#the-lab-tidemark-lab-offsets", ""},
		{"#title-1", ""},
		{"https://example.com/x.md#y", ""},
		{"b.md", "no such file"},
		{"#title-2", "no heading #title-2 in a.md"},
		{"#not-a-heading", "no heading #not-a-heading in a.md"},
	} {
		if got := checkLink(doc, tt.target); got != tt.want {
			t.Errorf("checkLink(%q) = %q, want %q", tt.target, got, tt.want)
		}
	}
}

// TestDocMakeTargets: every `make TARGET` in the code of README.md and
// docs/*.md (code spans, and code blocks' lines that begin with it) is a
// target of the Makefile.
func TestDocMakeTargets(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z-]*):`).FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	target := regexp.MustCompile(`(?:^|[\s;&(])make ([a-z][a-z-]*)`)
	command := regexp.MustCompile(`^\s*(?:\$ )?make ([a-z][a-z-]*)`)
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		prose := proseLines(string(b))
		for n, line := range strings.Split(string(b), "\n") {
			re, code := command, line // a line of a code block
			if prose[n] != "" {
				re = target
				var spans []string
				for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
					spans = append(spans, m[1])
				}
				code = strings.Join(spans, "\n")
			}
			for _, m := range re.FindAllStringSubmatch(code, -1) {
				checked++
				if !targets[m[1]] {
					t.Errorf("%s:%d: make %s: no such target in the Makefile", filepath.Base(doc), n+1, m[1])
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no make command found in the docs: the pattern is wrong")
	}
}

// TestScalingFromBenchJSON: a bench.json with a partition-scaling report
// (make bench runs every workload) is where the table comes from; without
// one, partitions.json.
func TestScalingFromBenchJSON(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(root, "docs", "bench", "partitions.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	reps, err := readBenchReports(dir) // no partitions.json there
	if err != nil {
		t.Fatal(err)
	}
	if reps.partitions != reps.bench {
		t.Error("the scaling report of bench.json is not used")
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.json"), []byte(`{"results": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readBenchReports(dir); err == nil {
		t.Error("no scaling report anywhere, and no error")
	}
}

var (
	// A test, benchmark, fuzz target or example a document cites:
	// TestX, BenchmarkX, FuzzX, ExampleX (a subtest's path after "/" is
	// not checked).
	citedTest = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz|Example)[A-Z0-9_][A-Za-z0-9_]*\b`)
	testFunc  = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*)\(`)
)

// testFuncs are the names of the Test, Benchmark, Fuzz and Example
// functions of the *_test.go files under dir, whatever their build tags
// and modules.
func testFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	funcs := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".testbed") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllSubmatch(b, -1) {
			funcs[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

// TestDocTestNames: every test, benchmark, fuzz target and example that
// README.md and docs/*.md name (prose and code blocks alike) is a
// function of a *_test.go file of the checkout, so a doc cannot cite as
// proof a test that was renamed, deleted or never merged.
func TestDocTestNames(t *testing.T) {
	funcs := testFuncs(t, root)
	if len(funcs) < 50 {
		t.Fatalf("found only %d test functions under %s: the walk is broken", len(funcs), root)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	cited := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			for _, ix := range citedTest.FindAllStringIndex(line, -1) {
				cited++
				name := line[ix[0]:ix[1]]
				if funcs[name] {
					continue
				}
				if isPattern(line, ix) && slices.ContainsFunc(slices.Collect(maps.Keys(funcs)), func(f string) bool { return strings.HasPrefix(f, name) }) {
					continue
				}
				t.Errorf("%s:%d: %s is no function of the checkout's *_test.go files", filepath.Base(doc), n+1, name)
			}
		}
	}
	if cited == 0 {
		t.Fatal("no test name found in the docs: the pattern is wrong")
	}
}

// isPattern says whether the name at line[ix[0]:ix[1]] is a pattern of
// names, not one: followed by "*" (`TestInboxRedrive*`) or given to
// go test's -run (`-run TestFranz`). A pattern must begin some name.
func isPattern(line string, ix []int) bool {
	if strings.HasPrefix(line[ix[1]:], "*") {
		return true
	}
	before := strings.TrimRight(line[:ix[0]], "'\"^(")
	return strings.HasSuffix(before, "-run ") || strings.HasSuffix(before, "-run=") || strings.HasSuffix(before, "-run")
}

// TestDocTestNamesFinds: the pattern takes the names as the docs write
// them, and the walk finds the functions of this package's tests.
func TestDocTestNamesFinds(t *testing.T) {
	got := citedTest.FindAllString("(`TestInboxRedriveBelowTheMark`: …; TestConformance/Revoke, BenchmarkTracker, FuzzTracker, ExampleRunner; Tests: Testbed)", -1)
	want := []string{"TestInboxRedriveBelowTheMark", "TestConformance", "BenchmarkTracker", "FuzzTracker", "ExampleRunner"}
	if !slices.Equal(got, want) {
		t.Errorf("cited %q, want %q", got, want)
	}
	for _, tt := range []struct {
		line string
		want bool
	}{
		{"`TestInboxRedrive*`", true},
		{"go test -run TestFranz ./integration/", true},
		{"go test -run 'TestFranz' ./integration/", true},
		{"go test -run=^TestFranz ./integration/", true},
		{"`TestFranz` proves it", false},
	} {
		ix := citedTest.FindStringIndex(tt.line)
		if got := isPattern(tt.line, ix); got != tt.want {
			t.Errorf("isPattern(%q) = %v, want %v", tt.line, got, tt.want)
		}
	}
	funcs := testFuncs(t, ".")
	if !funcs["TestDocTestNames"] || funcs["TestInboxRedriveAfterAnOutageWithinRetainFor"] {
		t.Error("the walk does not find this package's tests as they are")
	}
}

var (
	deadLetterTopic = regexp.MustCompile(`DeadLetter\("([^"]+)"`)
	replayFrom      = regexp.MustCompile(`dlt replay --from (\S+)`)
)

// TestDocReplayTopics: a document's `tidemark dlt replay --from T` redrives
// a topic its own examples dead-letter to: one of the DeadLetter topics
// written above it, or, when none is, anywhere in the document. (The
// README's redrive once named orders.dlt under an example that writes to
// orders.dlq.)
func TestDocReplayTopics(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range replayFrom.FindAllStringSubmatchIndex(text, -1) {
			checked++
			from := text[m[2]:m[3]]
			var topics []string
			for _, d := range deadLetterTopic.FindAllStringSubmatch(text[:m[0]], -1) {
				topics = append(topics, d[1])
			}
			if len(topics) == 0 {
				for _, d := range deadLetterTopic.FindAllStringSubmatch(text, -1) {
					topics = append(topics, d[1])
				}
			}
			if !slices.Contains(topics, from) {
				t.Errorf("%s:%d: dlt replay --from %s, where the document dead-letters to %v", filepath.Base(doc), strings.Count(text[:m[0]], "\n")+1, from, topics)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no dlt replay --from in the docs: the pattern is wrong")
	}
}

// TestProseVerdictsFollowTheReport: the words the prose generators make
// of a figure change with it — a target missed, a growth above the goal,
// kafka-go below its Reader — so a worse report cannot keep "met".
func TestProseVerdictsFollowTheReport(t *testing.T) {
	read := func() *benchReports {
		reps, err := readBenchReports(filepath.Join(root, "docs", "bench"))
		if err != nil {
			t.Fatal(err)
		}
		return reps
	}
	for _, tt := range []struct {
		name string
		edit func(*benchReports)
		gen  func(*benchReports) (string, error)
		want string
	}{
		{"no-op below 0.7", func(r *benchReports) {
			for i := range r.bench.Results {
				if x := &r.bench.Results[i]; x.Workload == "noop" && strings.HasPrefix(x.Consumer, "tidemark over franz") {
					x.Ratio = 0.65
				}
			}
		}, benchTargets, "No-op ≥ 0.7× the plain franz loop — not met (0.65×"},
		{"I/O-bound below 80%", func(r *benchReports) {
			for i := range r.bench.Results {
				if x := &r.bench.Results[i]; strings.HasPrefix(x.Workload, "sleep") && strings.HasPrefix(x.Consumer, "tidemark over kafkago") {
					x.OfTheory = 0.75
				}
			}
		}, benchTargets, "— not met (86% over franz, 75% over kafkago)"},
		{"kafka-go below the Reader", func(r *benchReports) {
			for i := range r.bench.Results {
				if x := &r.bench.Results[i]; x.Workload == "noop" && strings.HasPrefix(x.Consumer, "tidemark over kafkago") {
					x.Ratio = 0.90
				}
			}
		}, readingKafkago, "**tidemark over kafka-go < the kafka-go Reader** (0.90×)"},
		{"growth above the goal", func(r *benchReports) {
			sc := r.partitions.Scaling
			for i := range sc.Rows {
				if x := &sc.Rows[i]; x.Series == "kafkago-sleep" && x.Partitions == slices.Max(sc.Partitions) {
					x.Growth = 1.5
				}
			}
		}, partitionsGoal, "the goal is not met: no median growth above 1.50×"},
	} {
		reps := read()
		before, err := tt.gen(reps)
		if err != nil {
			t.Fatal(err)
		}
		tt.edit(reps)
		got, err := tt.gen(reps)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, tt.want) || got == before {
			t.Errorf("%s: %q, want it to say %q", tt.name, got, tt.want)
		}
	}
}
