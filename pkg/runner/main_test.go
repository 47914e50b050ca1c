package runner_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// runner goroutine must be gone once Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
