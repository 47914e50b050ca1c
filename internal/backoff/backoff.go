// Package backoff computes the waits between retries: exponential from an
// initial wait, doubling per attempt up to a maximum, and, for Jittered,
// drawn with equal jitter so that many retries started together do not
// stay in step. It serves the runner (handler attempts, dead-letter writes,
// the assign hook), the inbox (transactions that hit a serialization
// failure or a deadlock) and the kafkago source (fetches and offset
// look-ups).
//
// Each caller passes its own initial and maximum waits; the functions keep
// no state and are safe for concurrent use.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential returns the wait before retry attempt+1, attempts counted
// from 1: initial doubled attempt-1 times, at most max. An attempt below 1
// counts as 1. It saturates at max: a max near the largest Duration caps
// the wait instead of overflowing it. It draws no jitter.
func Exponential(initial, max time.Duration, attempt int) time.Duration {
	d := initial
	for i := 1; i < attempt && d < max; i++ {
		if d > max/2 {
			return max // doubling would pass max, or overflow
		}
		d *= 2
	}
	return min(d, max)
}

// Jittered returns Exponential(initial, max, attempt) with equal jitter:
// a wait drawn uniformly from [d/2, d], d being Exponential's wait. Half of
// d is always waited, so a retry never comes at once; the other half is
// random, so retries that failed together spread over it.
func Jittered(initial, max time.Duration, attempt int) time.Duration {
	d := Exponential(initial, max, attempt)
	return d/2 + rand.N(d/2+1)
}
