package inbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// TestOriginOf: which records the handlers take for redriven dead letters,
// and the permanent error for origin headers they cannot read.
func TestOriginOf(t *testing.T) {
	h := func(kv ...string) []runner.Header {
		var hs []runner.Header
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, runner.Header{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	const T, P, O = runner.HeaderOriginTopic, runner.HeaderOriginPartition, runner.HeaderOriginOffset
	tests := []struct {
		name    string
		headers []runner.Header
		want    string // the origin, "" for none
		bad     bool   // ErrBadOrigin
	}{
		{"no origin", h("message-id", "m"), "", false},
		{"origin", h(T, "orders", P, "2", O, "41"), "orders/2@41", false},
		{"the last header of each name", h(T, "x", T, "orders", P, "2", O, "1", O, "41"), "orders/2@41", false},
		{"itself", h(T, "t", P, "1", O, "9"), "", false},
		{"no offset", h(T, "orders", P, "2"), "", true},
		{"no topic", h(P, "2", O, "41"), "", true},
		{"empty topic", h(T, "", P, "2", O, "41"), "", true},
		{"offset not a number", h(T, "orders", P, "2", O, "4x"), "", true},
		{"negative partition", h(T, "orders", P, "-1", O, "41"), "", true},
		{"partition too large", h(T, "orders", P, "4294967296", O, "41"), "", true},
		{"offset too large", h(T, "orders", P, "2", O, "9223372036854775808"), "", true},
		// Not a topic Kafka can have; PostgreSQL refuses the first two in
		// a text column (22021), which failed the claim of every record
		// of the batch, retryable, on every attempt.
		{"topic not UTF-8", h(T, "ord\xffers", P, "2", O, "41"), "", true},
		{"topic with a NUL", h(T, "ord\x00ers", P, "2", O, "41"), "", true},
		{"topic with a space", h(T, "my orders", P, "2", O, "41"), "", true},
		{"topic too long", h(T, strings.Repeat("o", 250), P, "2", O, "41"), "", true},
		{"topic of 249 bytes", h(T, strings.Repeat("o", 249), P, "2", O, "41"), strings.Repeat("o", 249) + "/2@41", false},
		{"topic with dots, dashes and underscores", h(T, "a.b-c_D9", P, "2", O, "41"), "a.b-c_D9/2@41", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := runner.Record{Topic: "t", Partition: 1, Offset: 9, Headers: tt.headers}
			got, err := inbox.OriginOf(&rec)
			if tt.bad {
				if !errors.Is(err, inbox.ErrBadOrigin) || runner.KindOf(err) != runner.PermanentKind {
					t.Fatalf("got %q, %v; want ErrBadOrigin, permanent", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestOriginBelowMarkError: permanent, and it names both records.
func TestOriginBelowMarkError(t *testing.T) {
	err := error(&inbox.OriginBelowMarkError{Record: "t/1@50", Origin: "t/0@3"})
	var pe *runner.PermanentError
	if runner.KindOf(err) != runner.PermanentKind || !errors.As(err, &pe) {
		t.Fatalf("%v: kind %v, want permanent", err, runner.KindOf(err))
	}
	if msg := err.Error(); !strings.Contains(msg, "t/1@50") || !strings.Contains(msg, "t/0@3") || !strings.Contains(msg, "RetainFor") {
		t.Fatalf("message %q does not name the records and the remedy", msg)
	}
}
