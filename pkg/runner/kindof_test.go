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
		// A handler that panics with a marked error: the panic is a
		// failed attempt of that kind.
		{"panic of a mark", &runner.PanicError{Record: "t/0@0", In: "handler", Value: p}, runner.PermanentKind},
		{"panic of a wrapped mark", &runner.PanicError{Record: "t/0@0", In: "handler", Value: fmt.Errorf("x: %w", tr)}, runner.TransientKind},
		{"panic of a string", &runner.PanicError{Record: "t/0@0", In: "handler", Value: "permanent"}, runner.Retryable},
		// A mark errors.As finds through an As method, not Unwrap.
		{"through As", asMark{permanent: true}, runner.PermanentKind},
		{"through As, transient", fmt.Errorf("x: %w", asMark{}), runner.TransientKind},
		{"through As, in a join", errors.Join(errPoison, asMark{permanent: true}), runner.PermanentKind},
	} {
		if tc.want != runner.Retryable && tc.err != nil {
			var pe *runner.PermanentError
			var te *runner.TransientError
			if !errors.As(tc.err, &pe) && !errors.As(tc.err, &te) {
				t.Fatalf("%s: errors.As finds no mark: the case is wrong", tc.name)
			}
		}
		if got := runner.KindOf(tc.err); got != tc.want {
			t.Errorf("%s: KindOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// asMark is an error that is a mark only through its As method, as an
// error type of a library may be.
type asMark struct{ permanent bool }

func (asMark) Error() string { return "as mark" }

func (m asMark) As(target any) bool {
	switch t := target.(type) {
	case **runner.PermanentError:
		if m.permanent {
			*t = &runner.PermanentError{Err: errPoison}
			return true
		}
	case **runner.TransientError:
		if !m.permanent {
			*t = &runner.TransientError{Err: errPoison}
			return true
		}
	}
	return false
}
