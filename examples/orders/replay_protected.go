//go:build !tidemark_unsafe

package main

import (
	"log/slog"
	"os"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// unsafeInboxOptions returns none: this build has no tidemark_unsafe tag,
// and its inbox cannot be told to apply replays (the hook does not exist
// in it). A set unsafeReplayEnv is logged, so that no one believes it
// took effect.
func unsafeInboxOptions(log *slog.Logger) ([]inbox.Option, error) {
	if v := os.Getenv(unsafeReplayEnv); v != "" {
		log.Warn(unsafeReplayEnv+" is ignored: this build has no tidemark_unsafe tag, and its inbox always skips replays", "value", v)
	}
	return nil, nil
}
