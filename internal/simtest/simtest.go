// Package simtest runs seeded, randomized simulations as Go tests: each
// run of a simulation is one seed, which fixes every choice its schedule
// makes (what to do, when, to whom), so a failing seed is run again with
// -sim.seed and makes the same choices. A simulation that drives
// goroutines on real time (the share source over kfake) replays its
// schedule, not the goroutines' interleaving; one inside a synctest
// bubble replays its timers too.
//
// The flags, given to go test after the packages (make sim passes them):
//
//	-sim.seed=N       run seed N alone (the one a failure printed)
//	-sim.seeds=N      run N seeds (each simulation has its own default,
//	                  what make test runs)
//	-sim.duration=D   run seeds for D instead, then print a summary
//	-sim.steps=N      cut every schedule to its first N steps (a failing
//	                  seed prints the shortest cut that still fails)
//	-sim.v            log every step of every schedule
//
// make test runs each simulation's default seeds, which are fixed (1, 2,
// 3, ...): the same schedules on every run, so a red make test is red
// again. make sim DURATION=10m draws new seeds from the clock and prints
// the first one that fails.
package simtest

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	seedFlag     = flag.Uint64("sim.seed", 0, "run this seed alone")
	seedsFlag    = flag.Int("sim.seeds", 0, "run this many seeds (0: the simulation's default)")
	durationFlag = flag.Duration("sim.duration", 0, "run new seeds for this long instead of the default ones")
	stepsFlag    = flag.Int("sim.steps", 0, "cut every schedule to its first N steps (0: whole)")
	verboseFlag  = flag.Bool("sim.v", false, "log every step")
)

// Sim is one run of a simulation: its seed, its random source and its
// tally of steps and faults.
type Sim struct {
	T    *testing.T
	Seed uint64
	Rand *rand.Rand
	// MaxSteps is the cut of the schedule (-sim.steps, or a shrinking
	// attempt's); 0: whole.
	MaxSteps int

	mu     sync.Mutex
	steps  int
	faults map[string]int
	trace  []string
}

// Step records one step of the schedule and reports whether the schedule
// goes on (false once MaxSteps steps were taken). what is logged with
// -sim.v and kept for the failure report.
func (s *Sim) Step(format string, args ...any) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.MaxSteps > 0 && s.steps >= s.MaxSteps {
		return false
	}
	s.steps++
	line := fmt.Sprintf("%d: %s", s.steps, fmt.Sprintf(format, args...))
	s.trace = append(s.trace, line)
	if *verboseFlag {
		s.T.Log(line)
	}
	return true
}

// Fault counts one injected fault of kind (a killed member, a dropped
// connection, ...); the summary of make sim adds them up.
func (s *Sim) Fault(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults == nil {
		s.faults = map[string]int{}
	}
	s.faults[kind]++
}

// Faults returns how many faults of kind were injected so far.
func (s *Sim) Faults(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults[kind]
}

// Steps returns the number of steps taken.
func (s *Sim) Steps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// Trace returns the schedule's last n steps, one per line.
func (s *Sim) Trace(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr := s.trace[max(0, len(s.trace)-n):]
	return strings.Join(tr, "\n")
}

// Intn returns a number in [lo, hi].
func (s *Sim) Intn(lo, hi int) int { return lo + s.Rand.IntN(hi-lo+1) }

// Dur returns a duration in [lo, hi].
func (s *Sim) Dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.Rand.Int64N(int64(hi-lo)+1))
}

// Chance reports true with probability p.
func (s *Sim) Chance(p float64) bool { return s.Rand.Float64() < p }

// Pick returns one of xs.
func Pick[T any](s *Sim, xs ...T) T { return xs[s.Rand.IntN(len(xs))] }

// Config is how a simulation runs.
type Config struct {
	// Name is the simulation's name in the summary and the replay line,
	// for example "share".
	Name string
	// Seeds is how many seeds make test runs (seeds 1..Seeds).
	Seeds int
	// Found is seeds that longer runs (make sim) found failing, kept
	// after their fix: make test runs them beside 1..Seeds.
	Found []uint64
	// Parallel is how many seeds run at once (default 1), whatever go
	// test's -parallel.
	Parallel int
	// Replay is the command that runs a seed again, %d standing for the
	// seed, printed with a failure.
	Replay string
	// Shrink: on a failure, run the failing seed again with shorter cuts
	// of its schedule and report the shortest that still fails. Only for
	// simulations whose schedules replay exactly (synctest).
	Shrink bool
}

// Run runs the simulation body once per seed, as subtests named by seed,
// and logs a summary: seeds, steps, faults by kind, wall time.
func Run(t *testing.T, cfg Config, body func(s *Sim)) {
	t.Helper()
	par := max(cfg.Parallel, 1)
	var (
		mu       sync.Mutex
		total    Summary
		failures atomic.Int32
	)
	total.Faults = map[string]int{}
	start := time.Now()
	record := func(sim *Sim, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		total.Seeds++
		total.Steps += sim.Steps()
		sim.mu.Lock()
		for k, v := range sim.faults {
			total.Faults[k] += v
		}
		sim.mu.Unlock()
		if !ok {
			failures.Add(1)
		}
	}
	// one runs seed as a subtest of parent.
	one := func(parent *testing.T, seed uint64, maxSteps int) bool {
		return parent.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			sim := &Sim{T: t, Seed: seed, Rand: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), MaxSteps: maxSteps}
			defer func() {
				record(sim, !t.Failed())
				if t.Failed() {
					t.Logf("%s simulation, seed %d failed after %d steps; the last of them:\n%s\nrun it again: %s",
						cfg.Name, seed, sim.Steps(), sim.Trace(30), fmt.Sprintf(cfg.Replay, seed))
				}
			}()
			body(sim)
		})
	}
	switch {
	case *seedFlag != 0:
		par = 1
		if !one(t, *seedFlag, *stepsFlag) && cfg.Shrink && *stepsFlag == 0 {
			shrink(t, cfg, total.Steps, func(n int) bool { return one(t, *seedFlag, n) })
		}
	case *durationFlag > 0:
		deadline := time.Now().Add(*durationFlag)
		base := uint64(time.Now().UnixNano())
		var next atomic.Uint64
		workers(par, func() {
			for time.Now().Before(deadline) && failures.Load() == 0 {
				one(t, base+next.Add(1), *stepsFlag)
			}
		})
	default:
		n := uint64(cfg.Seeds)
		if *seedsFlag > 0 {
			n = uint64(*seedsFlag)
		}
		seeds := make([]uint64, 0, int(n)+len(cfg.Found))
		for seed := uint64(1); seed <= n; seed++ {
			seeds = append(seeds, seed)
		}
		if *seedsFlag == 0 {
			seeds = append(seeds, cfg.Found...)
		}
		var next atomic.Int64
		workers(par, func() {
			for i := next.Add(1) - 1; i < int64(len(seeds)); i = next.Add(1) - 1 {
				one(t, seeds[i], *stepsFlag)
			}
		})
	}
	total.Wall = time.Since(start)
	t.Logf("%s simulation: %s", cfg.Name, total)
}

// workers runs f on n goroutines and waits for them. Subtests run from
// goroutines of their own (t.Run allows it) are not held to go test's
// -parallel, which is GOMAXPROCS: a simulation's seeds mostly wait.
func workers(n int, f func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(f)
	}
	wg.Wait()
}

// Summary is the tally of a simulation's runs.
type Summary struct {
	Seeds, Steps int
	Faults       map[string]int
	Wall         time.Duration
}

func (s Summary) String() string {
	var fs []string
	for k, v := range s.Faults {
		fs = append(fs, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(fs)
	return fmt.Sprintf("%d seeds, %d steps, faults: [%s], in %v", s.Seeds, s.Steps, strings.Join(fs, ", "), s.Wall.Round(time.Millisecond))
}

// shrink finds the shortest cut of a failing schedule of steps steps that
// still fails (passes(n) runs the seed cut to n steps), by bisection: a
// cut too short to fail passes.
func shrink(t *testing.T, cfg Config, steps int, passes func(n int) bool) {
	lo, hi := 0, steps // lo passes (nothing fails with no steps), hi fails
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if passes(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	t.Logf("%s simulation, seed %d: the shortest failing cut is its first %d steps (-sim.steps=%d)", cfg.Name, *seedFlag, hi, hi)
}
