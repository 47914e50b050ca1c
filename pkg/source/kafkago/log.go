package kafkago

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	kafka "github.com/segmentio/kafka-go"
)

// kafkaLogger passes kafka-go's printf-style log lines to l at level, or
// returns nil (kafka-go then formats nothing) when l does not log at that
// level.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.Logger {
	if !l.Enabled(context.Background(), level) {
		return nil
	}
	return kafka.LoggerFunc(func(format string, args ...any) {
		l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, args...)))
	})
}
