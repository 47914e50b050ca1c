//go:build tidemark_unsafe

package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// unsafeInboxOptions returns inbox.UnsafeNoReplayProtection when
// unsafeReplayEnv is true. This file is built only with the tidemark_unsafe
// tag, for the chaos suite's proof run (integration/chaos,
// TestStrictCheckBites); such a binary must never run a real service.
func unsafeInboxOptions(log *slog.Logger) ([]inbox.Option, error) {
	v := os.Getenv(unsafeReplayEnv)
	if v == "" {
		return nil, nil
	}
	off, err := strconv.ParseBool(v)
	if err != nil {
		return nil, fmt.Errorf("%s %q: want true or false", unsafeReplayEnv, v)
	}
	if !off {
		return nil, nil
	}
	log.Warn("REPLAY PROTECTION OFF: a tidemark_unsafe build with " + unsafeReplayEnv + "=true applies replayed orders again (a test of the tests)")
	return []inbox.Option{inbox.UnsafeNoReplayProtection()}, nil
}
