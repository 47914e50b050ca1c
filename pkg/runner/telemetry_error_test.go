package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

// namedError names its own error.type, as the semconv package reads it.
type namedError struct{}

func (namedError) Error() string     { return "quota" }
func (namedError) ErrorType() string { return "QUOTA_EXCEEDED" }

// TestErrorType: error.type is low in cardinality and names the cause, not
// the wrapping: an ErrorType method wins, then the runner's and context's
// sentinels by name, then the Go type under the Permanent and Transient
// marks and fmt.Errorf's wrapping.
func TestErrorType(t *testing.T) {
	var syntax *json.SyntaxError
	if err := json.Unmarshal([]byte("{"), new(any)); !errors.As(err, &syntax) {
		t.Fatalf("json.Unmarshal(\"{\") = %v, want a *json.SyntaxError", err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "_OTHER"},
		{errors.New("boom"), "*errors.errorString"},
		{fmt.Errorf("order 7: %w", errors.New("boom")), "*errors.errorString"},
		{syntax, "*json.SyntaxError"},
		{Permanent(syntax), "*json.SyntaxError"},
		{fmt.Errorf("decoding: %w", Permanent(fmt.Errorf("value: %w", syntax))), "*json.SyntaxError"},
		{Transient(syntax), "*json.SyntaxError"},
		{&PanicError{Record: "t/0@1", In: "handler", Value: "nil map"}, "*runner.PanicError"},
		{fmt.Errorf("lease moved: %w", ErrFenced), "runner.ErrFenced"},
		{ErrOutcomeUnknown, "runner.ErrOutcomeUnknown"},
		{fmt.Errorf("query: %w", context.Canceled), "context.Canceled"},
		{context.DeadlineExceeded, "context.DeadlineExceeded"},
		{fmt.Errorf("charging: %w", namedError{}), "QUOTA_EXCEEDED"},
		{Permanent(namedError{}), "QUOTA_EXCEEDED"},
	} {
		if got := errorType(tc.err); got != tc.want {
			t.Errorf("errorType(%#v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
