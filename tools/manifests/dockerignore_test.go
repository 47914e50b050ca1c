package manifests_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

const (
	repoRoot   = "../.."
	dockerfile = "examples/orders/Dockerfile"
)

// dockerignore reads the build context's .dockerignore into Docker's own
// matcher (moby/patternmatcher, which the classic builder and BuildKit use).
func dockerignore(t *testing.T, content []byte) *patternmatcher.PatternMatcher {
	t.Helper()
	pats, err := ignorefile.ReadAll(bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(pats)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// buildInputs is every file the Dockerfile's build reads from the context:
// the sources of its COPY lines (but COPY . .) and, for the go build of
// ./orders and ./orders/produce in the examples module (GOWORK=off, as the
// Dockerfile does), the go.mod and Go files of each package in this
// repository that the build compiles.
func buildInputs(t *testing.T) []string {
	t.Helper()
	df, err := os.ReadFile(filepath.Join(repoRoot, dockerfile))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	sc := bufio.NewScanner(bytes.NewReader(df))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "COPY" || strings.HasPrefix(f[1], "--from") {
			continue
		}
		for _, src := range f[1 : len(f)-1] {
			if src != "." {
				files = append(files, src)
			}
		}
	}
	if len(files) == 0 {
		t.Fatalf("%s: no COPY sources found", dockerfile)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{"\t"}}{{join .GoFiles " "}}{{"\t"}}{{join .EmbedFiles " "}}{{end}}`, "./orders", "./orders/produce")
	cmd.Dir = filepath.Join(root, "examples")
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list in examples: %v\n%s", err, out)
	}
	inRepo := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, rest, _ := strings.Cut(line, "\t")
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // the module cache
		}
		inRepo++
		goFiles, embeds, _ := strings.Cut(rest, "\t")
		for _, f := range append(strings.Fields(goFiles), strings.Fields(embeds)...) {
			files = append(files, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if inRepo < 3 {
		t.Fatalf("go list found %d packages of this repository in the build, want the examples and the library's:\n%s", inRepo, out)
	}
	return files
}

// mustStayOut are files of this repository the build does not read and
// that must not be sent: the history, the bed's data and jars, the
// benchmark reports, the workspace and another module.
var mustStayOut = []string{".git/HEAD", ".testbed/env", ".testbed/kafka/libs/kafka.jar", "docs/bench/bench.json", "go.work", "cmd/tidemark-bench/main.go"}

// ignoreProblems is what is wrong with an ignore file for the build.
func ignoreProblems(pm *patternmatcher.PatternMatcher, inputs []string) []string {
	var p []string
	for _, f := range inputs {
		if ex, err := pm.MatchesOrParentMatches(f); err != nil || ex {
			p = append(p, ".dockerignore excludes "+f+", which the image's build reads ("+dockerfile+")")
		}
	}
	for _, f := range mustStayOut {
		if ex, err := pm.MatchesOrParentMatches(f); err != nil || !ex {
			p = append(p, ".dockerignore sends "+f+" to the build, which does not read it")
		}
	}
	return p
}

func TestDockerignore(t *testing.T) {
	content, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	inputs := buildInputs(t)
	for _, p := range ignoreProblems(dockerignore(t, content), inputs) {
		t.Error(p)
	}
	t.Logf("%d files the build reads are in the context", len(inputs))
}

// TestDockerignoreMutations: an ignore file that leaves out a package the
// build compiles, or lets .git or the bed in, fails and names the file.
func TestDockerignoreMutations(t *testing.T) {
	base, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	inputs := buildInputs(t)
	for _, m := range []struct{ name, old, new, want string }{
		{"internal left out", "!internal/\n", "", "excludes internal/"},
		{"examples' go.sum left out", "!examples/\n", "!examples/\nexamples/go.sum\n", "excludes examples/go.sum,"},
		{"library's go.mod left out", "!go.mod\n", "", "excludes go.mod,"},
		{"everything sent", "*\n", "", "sends .git/HEAD"},
		{"the bed sent", "!examples/\n", "!examples/\n!.testbed/\n", "sends .testbed/env"},
	} {
		t.Run(m.name, func(t *testing.T) {
			p := ignoreProblems(dockerignore(t, edit(t, base, m.old, m.new)), inputs)
			if !strings.Contains(strings.Join(p, "\n"), m.want) {
				t.Fatalf("want a problem naming %q; have %q", m.want, p)
			}
		})
	}
}
