//go:build integration && race

package integration_test

// raceDetector is true when the tests run with -race, whose bookkeeping
// multiplies heap growth; memory bounds are checked tightly only without it
// (make test runs TestBoundedMemory both ways).
const raceDetector = true
