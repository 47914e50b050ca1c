package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		panic("building tidemark: " + err.Error())
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestExitStatus runs the real binary: 0 for a trace, 2 only for a
// malformed script, 1 for anything else.
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
		{"unknown flag", []string{"lab", "offsets", "--nope"}, "", 1, "", "flag provided but not defined"},
		{"unknown command", []string{"inspect"}, "", 1, "", "usage: tidemark"},
		{"no command", nil, "", 1, "", "usage: tidemark"},
		{"help", []string{"help"}, "", 0, "lab offsets", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			cmd.Stdin = strings.NewReader(tt.stdin)
			runExpect(t, cmd, tt.code, tt.stdout, tt.stderr)
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
