//go:build !tidemark_unsafe

package inbox_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/inbox"
)

// TestReplayProtectionAlwaysOn: without the tidemark_unsafe tag a Store
// always skips replays, and its assign hook's filter reports the applied
// offsets. (UnsafeNoReplayProtection does not exist in this build: a
// caller would not compile.)
func TestReplayProtectionAlwaysOn(t *testing.T) {
	s, err := inbox.New(nowhere(t), "g", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if !inbox.ReplayProtected(s) {
		t.Fatal("a Store of a build without tidemark_unsafe does not skip replays")
	}
	checkFilter(t, s, true)
}
