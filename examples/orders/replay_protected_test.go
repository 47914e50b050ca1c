//go:build !tidemark_unsafe

package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestUnsafeReplayEnvIgnored: without the tidemark_unsafe tag the variable
// that would switch the inbox's replay protection off gives no inbox
// option, whatever its value, and says so in the log.
// integration/chaos's TestStrictCheckBites shows the same on a running
// consumer: its redelivered orders are replays.
func TestUnsafeReplayEnvIgnored(t *testing.T) {
	for _, v := range []string{"true", "1", "yes please"} {
		t.Setenv(unsafeReplayEnv, v)
		var buf bytes.Buffer
		opts, err := unsafeInboxOptions(slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil || len(opts) != 0 {
			t.Errorf("%s=%q: %d inbox options, err %v; want none in a build without tidemark_unsafe", unsafeReplayEnv, v, len(opts), err)
		}
		if !strings.Contains(buf.String(), "is ignored") {
			t.Errorf("%s=%q: the log does not say it is ignored: %q", unsafeReplayEnv, v, buf.String())
		}
	}
}
