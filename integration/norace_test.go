//go:build integration && !race

package integration_test

const raceDetector = false
