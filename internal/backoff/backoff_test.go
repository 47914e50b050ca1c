package backoff_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/backoff"
)

const ms = time.Millisecond

// The parameters of the three callers: the runner's defaults (Backoff),
// the inbox's transaction retries and the kafkago source's retries.
var callers = []struct {
	name         string
	initial, max time.Duration
	want         []time.Duration // Exponential for attempts 1, 2, ...
}{
	{"runner", 100 * ms, 10 * time.Second, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second, 10 * time.Second}},
	{"inbox", 10 * ms, time.Second, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}},
	{"kafkago", 100 * ms, 2 * time.Second, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second}},
	{"initial equals max", ms, ms, []time.Duration{ms, ms, ms}},
	{"max not a doubling", 3 * ms, 10 * ms, []time.Duration{3 * ms, 6 * ms, 10 * ms, 10 * ms}},
}

func TestExponential(t *testing.T) {
	for _, c := range callers {
		t.Run(c.name, func(t *testing.T) {
			for i, want := range c.want {
				if got := backoff.Exponential(c.initial, c.max, i+1); got != want {
					t.Errorf("attempt %d: %v, want %v", i+1, got, want)
				}
			}
			for _, attempt := range []int{0, -1} {
				if got := backoff.Exponential(c.initial, c.max, attempt); got != c.initial {
					t.Errorf("attempt %d: %v, want the initial %v", attempt, got, c.initial)
				}
			}
			if got := backoff.Exponential(c.initial, c.max, math.MaxInt); got != c.max {
				t.Errorf("attempt MaxInt: %v, want the max %v", got, c.max)
			}
		})
	}
}

// TestExponentialSaturates: a max near the largest Duration caps the wait
// instead of overflowing into a negative one.
func TestExponentialSaturates(t *testing.T) {
	const max = time.Duration(math.MaxInt64)
	for attempt := 1; attempt <= 100; attempt++ {
		got := backoff.Exponential(time.Hour, max, attempt)
		if got < time.Hour || got > max {
			t.Fatalf("attempt %d: %v, want within [1h, %v]", attempt, got, max)
		}
	}
	if got := backoff.Jittered(time.Hour, max, 100); got < max/2 {
		t.Fatalf("Jittered at attempt 100: %v, want at least %v", got, max/2)
	}
}

// TestJitteredIsEqualJitter: every wait is in [d/2, d], and the draws
// spread over that range rather than sitting at one end of it.
func TestJitteredIsEqualJitter(t *testing.T) {
	for _, c := range callers {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.want {
				d := backoff.Exponential(c.initial, c.max, i+1)
				lo, hi := d, time.Duration(0)
				for range 1000 {
					got := backoff.Jittered(c.initial, c.max, i+1)
					if got < d/2 || got > d {
						t.Fatalf("attempt %d: %v not in [%v, %v]", i+1, got, d/2, d)
					}
					lo, hi = min(lo, got), max(hi, got)
				}
				// The chance that 1,000 uniform draws all miss an
				// eighth of the range is (7/8)^1000, about 1e-58.
				if lo > d/2+d/8 || hi < d-d/8 {
					t.Fatalf("attempt %d: draws in [%v, %v], want them spread over [%v, %v]", i+1, lo, hi, d/2, d)
				}
			}
		})
	}
}

func ExampleExponential() {
	for attempt := 1; attempt <= 6; attempt++ {
		fmt.Print(backoff.Exponential(100*time.Millisecond, 2*time.Second, attempt), " ")
	}
	fmt.Println()
	// Output: 100ms 200ms 400ms 800ms 1.6s 2s
}
