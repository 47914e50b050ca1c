package runner_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestJSONTimeFieldErrorDoesNotQuoteTheValue: a struct with a time.Time
// field (the commonest field with its own UnmarshalJSON) given a value
// that is not a time: the error JSON returns, which goes into the
// *DecodeError, the logs and the dead-letter headers, must not carry the
// value's bytes, as DecodeError promises.
func TestJSONTimeFieldErrorDoesNotQuoteTheValue(t *testing.T) {
	type order struct{ At time.Time }
	const secret = "card-4111111111111111"
	_, err := runner.JSON[order]()([]byte(`{"At":"` + secret + `"}`))
	if err == nil {
		t.Fatal("no error for a time field holding a card number")
	}
	de := &runner.DecodeError{Record: "t/0@0", Size: 30, Err: err}
	if strings.Contains(de.Error(), "4111") {
		t.Fatalf("the DecodeError quotes the value: %q", de.Error())
	}
}
