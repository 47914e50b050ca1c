package dltcmd_test

import (
	"slices"
	"testing"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/dltcmd"
	"github.com/tidemark/tidemark/pkg/runner"
)

func headers(kv ...string) []runner.Header {
	var hs []runner.Header
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, runner.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

// letter is a dead letter of orders/2@41 that failed with "poison: bad".
var letter = headers("trace", "t1",
	runner.HeaderError, "poison: bad amount", runner.HeaderErrorType, "*app.ValidationError",
	runner.HeaderAttempts, "3", runner.HeaderGroup, "svc", runner.HeaderErrorKind, "permanent",
	runner.HeaderFirstFailure, "a", runner.HeaderLastFailure, "b",
	runner.HeaderOriginTopic, "orders", runner.HeaderOriginPartition, "2", runner.HeaderOriginOffset, "41",
	runner.HeaderOriginKey, "k", runner.HeaderOriginTimestamp, "2026-12-01T10:00:00Z")

func TestFilterMatch(t *testing.T) {
	any := dltcmd.Filter{Partition: -1, To: -1}
	tests := []struct {
		name string
		f    dltcmd.Filter
		hs   []runner.Header
		want string // "" taken, else the reason it is left
	}{
		{"everything", any, letter, ""},
		{"no origin", any, headers("trace", "t1"), dltcmd.LeftNoOrigin},
		{"malformed origin", any, headers(runner.HeaderOriginTopic, "orders", runner.HeaderOriginPartition, "x", runner.HeaderOriginOffset, "1"), dltcmd.LeftNoOrigin},
		{"cut", any, append(slices.Clone(letter), runner.Header{Key: runner.HeaderDeadLetterCut, Value: []byte("value,headers")}), dltcmd.LeftCut},
		{"origin topic", dltcmd.Filter{OriginTopic: "orders", Partition: -1, To: -1}, letter, ""},
		{"other origin topic", dltcmd.Filter{OriginTopic: "refunds", Partition: -1, To: -1}, letter, dltcmd.LeftOtherOrigin},
		{"partition", dltcmd.Filter{Partition: 2, To: -1}, letter, ""},
		{"other partition", dltcmd.Filter{Partition: 1, To: -1}, letter, dltcmd.LeftFiltered},
		{"offset range", dltcmd.Filter{Partition: -1, From: 41, To: 41}, letter, ""},
		{"before the range", dltcmd.Filter{Partition: -1, From: 42, To: -1}, letter, dltcmd.LeftFiltered},
		{"after the range", dltcmd.Filter{Partition: -1, From: 0, To: 40}, letter, dltcmd.LeftFiltered},
		{"error text", dltcmd.Filter{Partition: -1, To: -1, Error: "bad amount"}, letter, ""},
		{"error type", dltcmd.Filter{Partition: -1, To: -1, Error: "ValidationError"}, letter, ""},
		{"other error", dltcmd.Filter{Partition: -1, To: -1, Error: "timeout"}, letter, dltcmd.LeftFiltered},
		{"header value", dltcmd.Filter{Partition: -1, To: -1, Headers: []dltcmd.HeaderMatch{{Key: "trace", Value: []byte("t1"), HasValue: true}}}, letter, ""},
		{"header other value", dltcmd.Filter{Partition: -1, To: -1, Headers: []dltcmd.HeaderMatch{{Key: "trace", Value: []byte("t2"), HasValue: true}}}, letter, dltcmd.LeftFiltered},
		{"header present", dltcmd.Filter{Partition: -1, To: -1, Headers: []dltcmd.HeaderMatch{{Key: "trace"}}}, letter, ""},
		{"header absent", dltcmd.Filter{Partition: -1, To: -1, Headers: []dltcmd.HeaderMatch{{Key: "tenant"}}}, letter, dltcmd.LeftFiltered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, why := tt.f.Match(tt.hs)
			if why != tt.want {
				t.Fatalf("left %q, want %q", why, tt.want)
			}
		})
	}
}

func TestParseOffsets(t *testing.T) {
	for s, want := range map[string][2]int64{"5": {5, 5}, "5-9": {5, 9}, "5-": {5, -1}, "0-0": {0, 0}} {
		from, to, err := dltcmd.ParseOffsets(s)
		if err != nil || from != want[0] || to != want[1] {
			t.Errorf("%q: %d, %d, %v; want %v", s, from, to, err, want)
		}
	}
	for _, s := range []string{"", "-5", "9-3", "a-b", "5-x", "1-2-3"} {
		if _, _, err := dltcmd.ParseOffsets(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

// TestRepublished: the failure headers go, everything else stays in order.
func TestRepublished(t *testing.T) {
	var got []string
	for _, h := range dltcmd.Republished(letter) {
		got = append(got, h.Key)
	}
	want := []string{"trace", runner.HeaderOriginTopic, runner.HeaderOriginPartition, runner.HeaderOriginOffset,
		runner.HeaderOriginKey, runner.HeaderOriginTimestamp}
	if !slices.Equal(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
}
