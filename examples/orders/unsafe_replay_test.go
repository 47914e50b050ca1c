//go:build tidemark_unsafe

package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestUnsafeReplayEnv: in a tidemark_unsafe build the variable gives the
// inbox's test hook when true, nothing when unset or false, and a value
// that is not a boolean is refused naming the variable.
func TestUnsafeReplayEnv(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for v, want := range map[string]int{"": 0, "false": 0, "true": 1, "1": 1} {
		t.Setenv(unsafeReplayEnv, v)
		opts, err := unsafeInboxOptions(log)
		if err != nil || len(opts) != want {
			t.Errorf("%s=%q: %d inbox options, err %v; want %d", unsafeReplayEnv, v, len(opts), err, want)
		}
	}
	t.Setenv(unsafeReplayEnv, "maybe")
	if _, err := unsafeInboxOptions(log); err == nil || !strings.Contains(err.Error(), unsafeReplayEnv) {
		t.Errorf("%s=maybe: %v, want an error naming the variable", unsafeReplayEnv, err)
	}
}
