package kafkatest

import (
	"io"
	"log/slog"
	"os"
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
