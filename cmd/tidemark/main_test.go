package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// bin is the tidemark binary built once for these tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidemark-cmd-test")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "tidemark")
	// Without VCS stamping, whatever GOFLAGS says: the version test wants
	// the "(devel)" a build outside a checkout prints (TestVersionLine
	// covers the stamped forms).
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		panic("building tidemark: " + err.Error())
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestExitStatus runs the real binary: 0 when the command did what was
// asked (help included), 2 for a usage error — an unknown command or flag,
// a missing sub-command or argument, a malformed lab script — and 1 when it
// ran and failed. Each usage error says what was wrong on stderr.
func TestExitStatus(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		stdin  string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"handoff table", []string{"lab", "offsets", "--case", "handoff"}, "", 0, "complete 108 (epoch 1)   old-assignment", ""},
		{"json", []string{"lab", "offsets", "--case", "stale", "--json"}, "", 0, `"outcome": "old-assignment"`, ""},
		{"malformed", []string{"lab", "offsets", "--script", "-"}, "assign 1 100\ndeliver 100\ndeliver 100\n", 2, "", "stdin: line 3: deliver: offset 100 is not greater than the previous delivered offset 100"},
		{"unknown flag", []string{"lab", "offsets", "--nope"}, "", 2, "", "flag provided but not defined: -nope\nusage: tidemark lab offsets"},
		{"stray argument", []string{"lab", "offsets", "normal"}, "", 2, "", "tidemark lab offsets: unexpected argument \"normal\"\nRun \"tidemark lab offsets -h\" for its usage."},
		{"unknown case", []string{"lab", "offsets", "--case", "x"}, "", 2, "", `unknown case "x"`},
		{"unreadable script", []string{"lab", "offsets", "--script", "/nonexistent/trace.lab"}, "", 1, "", "tidemark lab offsets: open /nonexistent/trace.lab: no such file or directory"},
		{"unknown command", []string{"inspect"}, "", 2, "", "tidemark: unknown command \"inspect\"\n\nusage: tidemark"},
		{"unknown flag first", []string{"--json"}, "", 2, "", "tidemark: unknown flag \"--json\""},
		{"no command", nil, "", 2, "", "tidemark: missing command\n\nusage: tidemark"},
		{"lab alone", []string{"lab"}, "", 2, "", "tidemark lab: missing sub-command"},
		{"lab unknown", []string{"lab", "trace"}, "", 2, "", `tidemark lab: unknown sub-command "trace"`},
		{"help", []string{"help"}, "", 0, "lab offsets", ""},
		{"help unknown", []string{"help", "inspect"}, "", 2, "", `tidemark help: unknown command "inspect"`},
		{"help help", []string{"help", "help"}, "", 0, "usage: tidemark <command>", ""},
		{"help -h", []string{"help", "-h"}, "", 0, "usage: tidemark <command>", ""},
		{"help lab offsets", []string{"help", "lab", "offsets"}, "", 0, "usage: tidemark lab offsets", ""},
		{"version", []string{"version"}, "", 0, "tidemark (devel) go1.", ""},
		{"--version", []string{"--version"}, "", 0, "tidemark (devel) go1.", ""},
		{"version argument", []string{"version", "now"}, "", 2, "", `tidemark version: unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			cmd.Stdin = strings.NewReader(tt.stdin)
			runExpect(t, cmd, tt.code, tt.stdout, tt.stderr)
		})
	}
}

// TestHelpEverywhere: -h, -help and --help on every command and
// sub-command print its usage to stdout, nothing to stderr, and exit 0;
// "tidemark help CMD" prints the same.
func TestHelpEverywhere(t *testing.T) {
	commands := []struct {
		args  []string
		usage string // the first line
	}{
		{nil, "usage: tidemark <command> [arguments]"},
		{[]string{"lab"}, "usage: tidemark lab <sub-command> [arguments]"},
		{[]string{"inbox"}, "usage: tidemark inbox <sub-command> [arguments]"},
		{[]string{"dlt"}, "usage: tidemark dlt <sub-command> [arguments]"},
		{[]string{"lab", "offsets"}, "usage: tidemark lab offsets "},
		{[]string{"inbox", "migrate"}, "usage: tidemark inbox migrate "},
		{[]string{"inbox", "leases"}, "usage: tidemark inbox leases "},
		{[]string{"dlt", "replay"}, "usage: tidemark dlt replay "},
		{[]string{"version"}, "usage: tidemark version"},
	}
	for _, c := range commands {
		var first string
		for _, h := range []string{"-h", "-help", "--help"} {
			args := append(slices.Clone(c.args), h)
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				var out, errOut bytes.Buffer
				cmd := exec.Command(bin, args...)
				cmd.Stdout, cmd.Stderr = &out, &errOut
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v (stderr %q)", err, errOut.String())
				}
				if !strings.HasPrefix(out.String(), c.usage) || errOut.Len() > 0 {
					t.Errorf("stdout %q\nstderr %q\nwant the usage %q on stdout, nothing on stderr", out.String(), errOut.String(), c.usage)
				}
				if first == "" {
					first = out.String()
				} else if out.String() != first {
					t.Errorf("%s prints another usage than %s", h, "-h")
				}
			})
		}
		if len(c.args) == 0 {
			continue
		}
		t.Run("help "+strings.Join(c.args, " "), func(t *testing.T) {
			out, err := exec.Command(bin, append([]string{"help"}, c.args...)...).Output()
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != first {
				t.Errorf("tidemark help %s:\n%s\nwant what -h prints:\n%s", strings.Join(c.args, " "), out, first)
			}
		})
	}
}

// runExpect runs cmd and fails t unless it exits with code and its stdout
// and stderr contain the substrings stdout and stderr. It returns stderr.
func runExpect(t *testing.T, cmd *exec.Cmd, code int, stdout, stderr string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if got != code {
		t.Fatalf("exit %d, want %d (stderr %q)", got, code, errOut.String())
	}
	if !strings.Contains(out.String(), stdout) || !strings.Contains(errOut.String(), stderr) {
		t.Errorf("stdout %q\nstderr %q\nwant %q and %q", out.String(), errOut.String(), stdout, stderr)
	}
	return errOut.String()
}

// TestDocsNameRealCommands: every `tidemark <command> <sub-command>` that
// README.md, docs/*.md or the examples' READMEs name is one this binary
// has (its -h exits 0), so a renamed command cannot linger in the docs.
func TestDocsNameRealCommands(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, "../../README.md")
	named := regexp.MustCompile(`\btidemark ([a-z]+) ([a-z]+)\b`)
	groups := map[string]bool{"lab": true, "inbox": true, "dlt": true}
	seen := map[string]bool{}
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !groups[m[1]] || seen[m[0]] {
				continue
			}
			seen[m[0]] = true
			if err := exec.Command(bin, m[1], m[2], "-h").Run(); err != nil {
				t.Errorf("%s names %q, which is no command: %v", filepath.Base(doc), m[0], err)
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no tidemark command named in the docs: the pattern is wrong")
	}
}
