package runner

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestClipErrorHeader: an error message longer than MaxErrorHeader is cut
// to it at a UTF-8 boundary and says how long it was; a shorter one is
// kept whole.
func TestClipErrorHeader(t *testing.T) {
	if got := string(clip("short", MaxErrorHeader)); got != "short" {
		t.Fatalf("clip(short) = %q", got)
	}
	long := strings.Repeat("é", MaxErrorHeader) // two bytes each
	got := clip(long, MaxErrorHeader)
	if len(got) > MaxErrorHeader || !utf8.Valid(got) {
		t.Fatalf("clipped to %d bytes (valid UTF-8 %v), want at most %d, valid", len(got), utf8.Valid(got), MaxErrorHeader)
	}
	if !strings.HasSuffix(string(got), "… (8192 bytes, cut)") || !strings.HasPrefix(string(got), "éé") {
		t.Fatalf("clipped message ends %q, want the note of the 8192 bytes", got[len(got)-40:])
	}
	hs := deadLetterHeaders(&Record{Topic: "t"}, "", errString(long), Retryable, 1, time.Time{}, time.Time{})
	for _, h := range hs {
		if h.Key == HeaderError && len(h.Value) > MaxErrorHeader {
			t.Fatalf("%s is %d bytes, above MaxErrorHeader", HeaderError, len(h.Value))
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestDeadLetterReplacesAMalformedOrigin: origin headers that are all
// there but name no record (a partition or offset that is not a number, a
// topic Kafka cannot have) are replaced by the record's own, once, so that
// the dead letter can be redriven; a valid one is kept.
func TestDeadLetterReplacesAMalformedOrigin(t *testing.T) {
	rec := func(topic, part, off string) *Record {
		return &Record{Topic: "t", Partition: 3, Offset: 42, Headers: []Header{
			{Key: HeaderOriginTopic, Value: []byte(topic)},
			{Key: HeaderOriginPartition, Value: []byte(part)},
			{Key: HeaderOriginOffset, Value: []byte(off)},
		}}
	}
	for _, tc := range []struct {
		name string
		rec  *Record
		want string
	}{
		{"valid", rec("orders", "1", "7"), "orders/1@7"},
		{"partition not a number", rec("orders", "x", "7"), "t/3@42"},
		{"negative offset", rec("orders", "1", "-1"), "t/3@42"},
		{"offset overflows", rec("orders", "1", "99999999999999999999"), "t/3@42"},
		{"topic not a Kafka name", rec("ord\xffers", "1", "7"), "t/3@42"},
	} {
		hs := deadLetterHeaders(tc.rec, "", errString("x"), Retryable, 1, time.Time{}, time.Time{})
		o, ok, err := OriginOf(hs)
		if !ok || err != nil || o.String() != tc.want {
			t.Errorf("%s: the dead letter's origin is %v (ok %v, err %v), want %s", tc.name, o, ok, err, tc.want)
		}
		n := 0
		for _, h := range hs {
			if h.Key == HeaderOriginTopic {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d %s headers, want 1", tc.name, n, HeaderOriginTopic)
		}
	}
}
