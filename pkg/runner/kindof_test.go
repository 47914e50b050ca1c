package runner_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
)

// TestKindOfFindsMarksAnywhere: the Permanent and Transient marks are found
// through every wrapping the runner and the standard library make:
// fmt.Errorf (one %w and several), errors.Join, *BatchError, *TimeoutError
// and *DecodeError; the outermost wins over one it wraps.
func TestKindOfFindsMarksAnywhere(t *testing.T) {
	p, tr := runner.Permanent(errPoison), runner.Transient(errPoison)
	for _, tc := range []struct {
		name string
		err  error
		want runner.ErrorKind
	}{
		{"plain", errPoison, runner.Retryable},
		{"nil", nil, runner.Retryable},
		{"wrapped", fmt.Errorf("a: %w", p), runner.PermanentKind},
		{"two %w, second", fmt.Errorf("%w and %w", errPoison, tr), runner.TransientKind},
		{"join, second", errors.Join(errPoison, p), runner.PermanentKind},
		{"join in join", errors.Join(errPoison, errors.Join(errPoison, tr)), runner.TransientKind},
		{"in a BatchError", &runner.BatchError{Index: 1, Err: p}, runner.PermanentKind},
		{"around a BatchError", runner.Transient(&runner.BatchError{Index: 1, Err: errPoison}), runner.TransientKind},
		{"in a TimeoutError", &runner.TimeoutError{Record: "t/0@0", Err: tr}, runner.TransientKind},
		{"in a DecodeError", &runner.DecodeError{Record: "t/0@0", Err: p}, runner.PermanentKind},
		{"outermost wins", runner.Transient(p), runner.TransientKind},
		{"outermost wins, wrapped", fmt.Errorf("x: %w", runner.Permanent(fmt.Errorf("y: %w", tr))), runner.PermanentKind},
	} {
		if got := runner.KindOf(tc.err); got != tc.want {
			t.Errorf("%s: KindOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}
