package kafkatest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// Logger returns a logger that writes to the test's output at warn level,
// or at the level TIDEMARK_TEST_LOG names (debug, info, error); with
// TIDEMARK_TEST_LOG=none it discards everything.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	switch os.Getenv("TIDEMARK_TEST_LOG") {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error":
		level = slog.LevelError
	case "none":
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// LogBuffer collects what a test's loggers write, for the test to read
// back. The zero LogBuffer is ready to use; it is safe for concurrent use,
// as a logger shared by a runner's goroutines needs.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Logger returns a logger that writes JSON lines at level and above to l.
func (l *LogBuffer) Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: level}))
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines decodes the JSON lines written so far (see Logger); a line that is
// not a JSON object fails the test.
func (l *LogBuffer) Lines(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("kafkatest: log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
