package runner_test

import (
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestMarksWithoutAnError: the runner's error types built without their
// wrapped error (a handler that writes &runner.PermanentError{Err: err}
// with a nil err) have a message, as BatchError's does: the runner calls
// Error on every failed attempt's error outside any recover, and a panic
// there takes down the process.
func TestMarksWithoutAnError(t *testing.T) {
	for _, err := range []error{
		&runner.PermanentError{},
		&runner.TransientError{},
		&runner.TimeoutError{Record: "t/0@0", Timeout: time.Second},
		&runner.DecodeError{Record: "t/0@0"},
		&runner.BatchError{Index: 1},
	} {
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%T without Err: Error panicked: %v", err, v)
				}
			}()
			if err.Error() == "" {
				t.Errorf("%T without Err: empty message", err)
			}
		}()
	}
}
