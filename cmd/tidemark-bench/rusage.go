package main

// What the kernel says of this process: its CPU time and peak RSS, and
// its open-file limit.

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration((tvSeconds(ru.Utime) + tvSeconds(ru.Stime)) * float64(time.Second))
}

// raiseFileLimit raises the soft RLIMIT_NOFILE to n when it is lower, and
// fails with what to do when the hard limit is below n.
func raiseFileLimit(n int) error {
	if n <= 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur >= uint64(n) {
		return nil
	}
	if lim.Max < uint64(n) {
		return fmt.Errorf("%d open files needed (one connection per partition and a margin), but the hard limit is %d: raise it (ulimit -Hn %d, as root) or use fewer partitions", n, lim.Max, n)
	}
	lim.Cur = uint64(n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", n, err)
	}
	return nil
}

// peakRSS returns this process's VmHWM in KiB, or 0 when /proc has none.
func peakRSS() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int
			fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib)
			return kib
		}
	}
	return 0
}
