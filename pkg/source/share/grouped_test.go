package share_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// TestGroupNamesTheGroup: the Source tells the runner its group through
// runner.Grouped (messaging.consumer.group.name on spans and metrics). New
// does not connect, so no broker is needed.
func TestGroupNamesTheGroup(t *testing.T) {
	t.Parallel()
	src, err := share.New([]string{"127.0.0.1:1"}, "orders-workers", []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	g, ok := runner.Source(src).(runner.Grouped)
	if !ok {
		t.Fatal("the Source does not implement runner.Grouped")
	}
	if got := g.Group(); got != "orders-workers" {
		t.Fatalf("Group() = %q, want %q", got, "orders-workers")
	}
}
