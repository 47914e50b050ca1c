package main_test

import (
	"os"
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
		{"help", []string{"inbox", "migrate", "-h"}, 0, "usage: tidemark inbox migrate [--dsn DSN]", ""},
		{"unknown flag", []string{"inbox", "migrate", "--dns", "x"}, 2, "", "flag provided but not defined: -dns\nusage: tidemark inbox migrate"},
		{"no database", []string{"inbox", "migrate"}, 2, "", "no database: pass --dsn, set TIDEMARK_PG_DSN, or set libpq's variables"},
		{"bad dsn from the environment", []string{"inbox", "migrate"}, 2, "", "TIDEMARK_PG_DSN is not a valid connection string"},
		{"bad dsn", []string{"inbox", "migrate", "--dsn", "postgres://u:secret@[::1"}, 2, "", "--dsn is not a valid connection string"},
		{"extra argument", []string{"inbox", "migrate", "--dsn", "x", "now"}, 2, "", `unexpected argument "now"`},
		{"bad timeout", []string{"inbox", "migrate", "--dsn", "x", "--timeout", "0s"}, 2, "", "--timeout 0s is not positive"},
		{"unreachable", []string{"inbox", "migrate", "--dsn", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"}, 1, "", "cannot use PostgreSQL"},
		{"listed in help", []string{"help"}, 0, "inbox migrate", ""},
		{"leases listed in help", []string{"help"}, 0, "inbox leases", ""},
		{"leases help", []string{"inbox", "leases", "-h"}, 0, "usage: tidemark inbox leases --group G", ""},
		{"leases without group", []string{"inbox", "leases", "--dsn", "x"}, 2, "", "--group is required"},
		{"yes without reset", []string{"inbox", "leases", "--dsn", "x", "--group", "g", "--yes"}, 2, "", "--yes confirms --reset"},
		{"leases bad dsn", []string{"inbox", "leases", "--dsn", "postgres://u:secret@[::1", "--group", "g"}, 2, "", "--dsn is not a valid connection string"},
		{"inbox alone", []string{"inbox"}, 2, "", "tidemark inbox: missing sub-command\n\nusage: tidemark inbox <sub-command>"},
		{"inbox help", []string{"inbox", "--help"}, 0, "  leases ", ""},
		{"inbox unknown", []string{"inbox", "reset"}, 2, "", `tidemark inbox: unknown sub-command "reset"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			// No database from the test's environment, unless the case
			// puts one there.
			cmd.Env = withoutDatabase(os.Environ())
			if tt.name == "bad dsn from the environment" {
				cmd.Env = append(cmd.Env, "TIDEMARK_PG_DSN=postgres://u:secret@[::1")
			}
			errOut := runExpect(t, cmd, tt.code, tt.stdout, tt.stderr)
			if strings.Contains(errOut, "secret") {
				t.Errorf("the password of the DSN is in the output: %q", errOut)
			}
		})
	}
}

// withoutDatabase is env without the variables that name a database.
func withoutDatabase(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "TIDEMARK_PG_DSN=") || strings.HasPrefix(kv, "PG") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
