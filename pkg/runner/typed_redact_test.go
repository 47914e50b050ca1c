package runner_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
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

// secretText is a TextUnmarshaler whose error quotes what it refused, as
// many do (netip.Addr's ParseAddr does).
type secretText struct{}

func (*secretText) UnmarshalText(b []byte) error { return fmt.Errorf("bad value %q", b) }

// secretJSON is an UnmarshalJSON method whose error quotes its input.
type secretJSON struct{}

func (*secretJSON) UnmarshalJSON(b []byte) error { return fmt.Errorf("refused %s", b) }

// TestJSONErrorsNeverQuoteTheValue: whatever refuses a value — a
// json.Number given a string, a field decoded through
// encoding.TextUnmarshaler (netip.Addr, or a user's type), a user's
// UnmarshalJSON, a misused ",string" tag, a syntax error — the error JSON
// returns carries none of the value's text, and errors.As still finds the
// decoder's own error under it.
func TestJSONErrorsNeverQuoteTheValue(t *testing.T) {
	const secret = "card4111111111111111"
	cases := []struct {
		name   string
		decode func([]byte) error
		value  string
	}{
		{"json.Number", func(b []byte) error {
			_, err := runner.JSON[struct{ N json.Number }]()(b)
			return err
		}, `{"N":"` + secret + `"}`},
		{"netip.Addr", func(b []byte) error {
			_, err := runner.JSON[struct{ IP netip.Addr }]()(b)
			return err
		}, `{"IP":"` + secret + `"}`},
		{"TextUnmarshaler", func(b []byte) error {
			_, err := runner.JSON[struct{ S secretText }]()(b)
			return err
		}, `{"S":"` + secret + `"}`},
		{"TextUnmarshaler map key", func(b []byte) error {
			_, err := runner.JSON[map[netip.Addr]int]()(b)
			return err
		}, `{"` + secret + `":1}`},
		{"UnmarshalJSON", func(b []byte) error {
			_, err := runner.JSON[struct{ S secretJSON }]()(b)
			return err
		}, `{"S":"` + secret + `"}`},
		{",string", func(b []byte) error {
			_, err := runner.JSON[struct {
				N int `json:",string"`
			}]()(b)
			return err
		}, `{"N":"` + secret + `"}`},
		{"syntax", func(b []byte) error {
			_, err := runner.JSON[map[string]int]()(b)
			return err
		}, `{"a":1,` + secret + `}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.decode([]byte(c.value))
			if err == nil {
				t.Fatalf("no error for %s", c.value)
			}
			de := &runner.DecodeError{Record: "t/0@0", Size: len(c.value), Err: err}
			for _, part := range []string{"4111", "card", "c"} {
				if part == "c" {
					// The syntax error's one character: only a
					// quoted 'c' would be the value's.
					part = "'c'"
				}
				if strings.Contains(de.Error(), part) {
					t.Fatalf("the error quotes the value (%q): %q", part, de.Error())
				}
			}
			if errors.Unwrap(err) == nil {
				t.Fatalf("%q unwraps to nothing: errors.As cannot find the decoder's error", err)
			}
		})
	}
}
