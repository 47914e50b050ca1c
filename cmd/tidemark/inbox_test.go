package main_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestInboxMigrateArguments: the command's usage errors, without a server
// (tests against a real PostgreSQL are in integration/inbox_test.go).
func TestInboxMigrateArguments(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"help", []string{"inbox", "migrate", "-h"}, 0, "", "usage: tidemark inbox migrate --dsn DSN"},
		{"no dsn", []string{"inbox", "migrate"}, 1, "", "--dsn is required"},
		{"bad dsn", []string{"inbox", "migrate", "--dsn", "postgres://u:secret@[::1"}, 1, "", "--dsn is not a valid connection string"},
		{"extra argument", []string{"inbox", "migrate", "--dsn", "x", "now"}, 1, "", `unexpected argument "now"`},
		{"bad timeout", []string{"inbox", "migrate", "--dsn", "x", "--timeout", "0s"}, 1, "", "--timeout 0s is not positive"},
		{"unreachable", []string{"inbox", "migrate", "--dsn", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"}, 1, "", "cannot use PostgreSQL"},
		{"listed in help", []string{"help"}, 0, "inbox migrate", ""},
		{"inbox alone", []string{"inbox"}, 1, "", "usage: tidemark"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tt.code, errOut.String())
			}
			if !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("stdout %q\nstderr %q\nwant %q and %q", out.String(), errOut.String(), tt.stdout, tt.stderr)
			}
			if strings.Contains(errOut.String(), "secret") {
				t.Errorf("the password of the DSN is in the output: %q", errOut.String())
			}
		})
	}
}
