//go:build integration && race

package integration_test

// raceDetector is true when the tests run with -race, whose bookkeeping
// multiplies heap growth; memory bounds are checked tightly only without it
// (make test runs the memory tests without it; under -race they check the
// looser bound).
const raceDetector = true
