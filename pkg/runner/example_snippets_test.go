package runner_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The documents whose code blocks are copies of this package's examples.
var snippetDocs = []string{"../../README.md", "../../docs/runner.md"}

// TestDocSnippets: every code block that a "<!-- snippet: NAME -->" line
// precedes in snippetDocs is the code between "// snippet: NAME" and
// "// end snippet" lines in this package's example_*_test.go files (the
// regions of one name joined with a blank line, each without its common
// indentation), so that the documents show code that compiles and, where
// an Example has an Output, runs as shown. Every region is shown
// somewhere.
func TestDocSnippets(t *testing.T) {
	regions := exampleRegions(t)
	used := map[string]bool{}
	for _, doc := range snippetDocs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for name, block := range docSnippets(t, doc, string(b)) {
			used[name] = true
			want, ok := regions[name]
			if !ok {
				t.Errorf("%s: snippet %q has no region in example_*_test.go", doc, name)
				continue
			}
			if block != want {
				t.Errorf("%s: snippet %q differs from its example code; copy it from example_*_test.go:\n%s", doc, name, want)
			}
		}
	}
	for name := range regions {
		if !used[name] {
			t.Errorf("snippet %q of example_*_test.go is in none of %v", name, snippetDocs)
		}
	}
}

// exampleRegions returns the snippet regions of example_*_test.go by name.
func exampleRegions(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("example_*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	parts := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, start := "", 0
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			switch s := strings.TrimSpace(l); {
			case strings.HasPrefix(s, "// snippet: "):
				if name != "" {
					t.Fatalf("%s:%d: snippet inside snippet %q", f, i+1, name)
				}
				name, start = strings.TrimPrefix(s, "// snippet: "), i+1
			case s == "// end snippet":
				if name == "" {
					t.Fatalf("%s:%d: end snippet without a snippet", f, i+1)
				}
				parts[name] = append(parts[name], dedent(lines[start:i]))
				name = ""
			}
		}
		if name != "" {
			t.Fatalf("%s: snippet %q has no end", f, name)
		}
	}
	regions := map[string]string{}
	for name, p := range parts {
		regions[name] = strings.Join(p, "\n\n")
	}
	return regions
}

// dedent trims blank lines at both ends and the tabs all lines share.
func dedent(lines []string) string {
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if len(l) >= indent {
			out[i] = l[indent:]
		}
	}
	return strings.Join(out, "\n")
}

// docSnippets returns the code blocks of a markdown document that a
// "<!-- snippet: NAME -->" line precedes, by name.
func docSnippets(t *testing.T, doc, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		s := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(s, "<!-- snippet: ") {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(s, "<!-- snippet: "), " -->")
		if i+1 >= len(lines) || lines[i+1] != "```go" {
			t.Fatalf("%s:%d: snippet %q is not followed by a ```go block", doc, i+1, name)
		}
		end := slices.Index(lines[i+2:], "```")
		if end < 0 {
			t.Fatalf("%s:%d: snippet %q's block has no end", doc, i+1, name)
		}
		if _, dup := out[name]; dup {
			t.Fatalf("%s:%d: snippet %q shown twice", doc, i+1, name)
		}
		out[name] = strings.Join(lines[i+2:i+2+end], "\n")
		i += 2 + end
	}
	return out
}

// TestReadmeProgramBuilds: README.md's "A handler" block, with "package
// main" put above it, builds as a program on its own — its imports are
// complete and it defines everything it uses (ctx, the signal handling,
// the effect). TestDocSnippets only shows that the block is the code of
// example_readme_test.go, whose package has other imports and helpers.
// The block is built through an overlay (go build -overlay) as a package
// inside this module that exists only for the build: nothing is written
// to the source tree.
func TestReadmeProgramBuilds(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block, ok := docSnippets(t, "README.md", string(b))["readme"]
	if !ok {
		t.Fatal(`README.md has no "<!-- snippet: readme -->" block`)
	}
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	if err := os.WriteFile(main, []byte("package main\n\n"+block+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pkgDir, err := filepath.Abs("internal/readmeprogram") // does not exist: the overlay makes it
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(pkgDir, "main.go"): main}})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-overlay", overlayFile, "-o", filepath.Join(dir, "readme"), "./internal/readmeprogram")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md's handler block does not build as a program: %v\n%s", err, out)
	}
}
