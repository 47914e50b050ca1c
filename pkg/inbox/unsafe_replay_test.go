//go:build tidemark_unsafe

package inbox_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// TestUnsafeNoReplayProtection: in a tidemark_unsafe build the option
// turns the Store's replay protection off — the assign hook returns no
// filter, so no record is skipped — and a Store without it keeps it on.
// integration/chaos's TestStrictCheckBites shows the claim side: a
// redelivered record is applied again.
func TestUnsafeNoReplayProtection(t *testing.T) {
	on, err := inbox.New(nowhere(t), "g", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if !inbox.ReplayProtected(on) {
		t.Fatal("a Store without UnsafeNoReplayProtection does not skip replays")
	}
	checkFilter(t, on, true)
	off, err := inbox.New(nowhere(t), "g", quiet, inbox.UnsafeNoReplayProtection())
	if err != nil {
		t.Fatal(err)
	}
	if inbox.ReplayProtected(off) {
		t.Fatal("UnsafeNoReplayProtection: the Store still skips replays")
	}
	checkFilter(t, off, false)
}
