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
