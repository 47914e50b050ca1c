package kafkago_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// TestRefusedWrites: the dead-letter write errors the runner cuts the dead
// letter for — the broker's, the topic's and the Writer's own size checks,
// an invalid record, inside the WriteErrors a synchronous write returns —
// and not the ones a retry can cure.
func TestRefusedWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Writer's BatchBytes", kafka.MessageTooLargeError{}, true},
		{"broker's size", kafka.WriteErrors{kafka.MessageSizeTooLarge}, true},
		{"record list", fmt.Errorf("w: %w", kafka.WriteErrors{nil, kafka.RecordListTooLarge}), true},
		{"invalid record", kafka.WriteErrors{kafka.InvalidRecord}, true},
		{"leader moved", kafka.WriteErrors{kafka.NotLeaderForPartition}, false},
		{"timeout", kafka.WriteErrors{kafka.RequestTimedOut}, false},
		{"dial", errors.New("dial tcp: connection refused"), false},
	} {
		if got := kafkago.RefusedForTest(tc.err); got != tc.want {
			t.Errorf("%s: refused = %v, want %v", tc.name, got, tc.want)
		}
	}
}
