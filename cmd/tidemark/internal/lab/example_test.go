package lab_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/lab"
)

// run replays a built-in case and prints one line per step.
func run(name string, strategy lab.Strategy) *lab.Trace {
	script, err := lab.Case(name)
	if err != nil {
		panic(err)
	}
	trace, err := lab.Run(strings.NewReader(script), strategy)
	if err != nil {
		panic(err)
	}
	for _, s := range trace.Steps {
		if s.Op == "complete" {
			fmt.Printf("line %2d: complete %d (epoch %d): %s, safe %d\n", s.Line, s.Offset, s.Epoch, s.Outcome, s.Safe)
		}
	}
	return trace
}

// The normal case: safe 100, 101, 109. Under --strategy naive
// the first violation is at the first completion: max(completed)+1 = 109
// would skip the unfinished 100 and 103.
func Example_normal() {
	trace := run("normal", lab.Naive)
	v := trace.Violations[0]
	fmt.Printf("first violation: line %d, unsafe_offset %d, skipped %v\n", v.Line, v.UnsafeOffset, v.Skipped)
	// Output:
	// line  6: complete 108 (epoch 1): recorded, safe 100
	// line  7: complete 100 (epoch 1): advanced, safe 101
	// line  8: complete 103 (epoch 1): advanced, safe 109
	// first violation: line 6, unsafe_offset 109, skipped [100 103]
}

// The stale trace: completions keep epoch 1 after epoch 2 begins; the safe
// offset stays 100 three times.
func Example_stale() {
	run("stale", lab.Prefix)
	// Output:
	// line  9: complete 108 (epoch 1): old-assignment, safe 100
	// line 10: complete 100 (epoch 1): old-assignment, safe 100
	// line 11: complete 103 (epoch 1): old-assignment, safe 100
}

// The handoff trace: 101, then not-owner and old-assignment, 101, 109, and
// the repeated 108 stays 109.
func Example_handoff() {
	run("handoff", lab.Prefix)
	// Output:
	// line  4: complete 100 (epoch 1): advanced, safe 101
	// line  6: complete 103 (epoch 1): not-owner, safe 101
	// line  9: complete 108 (epoch 1): old-assignment, safe 101
	// line 10: complete 108 (epoch 2): recorded, safe 101
	// line 11: complete 103 (epoch 2): advanced, safe 109
	// line 12: complete 108 (epoch 2): duplicate, safe 109
}

// What `tidemark lab offsets --case handoff` prints.
func ExampleOffsets() {
	lab.Offsets([]string{"--case", "handoff"}, nil, os.Stdout, os.Stderr)
	// Output:
	// tidemark lab offsets: case handoff, strategy prefix
	//
	// LINE  OWNER    STEP                     OUTCOME         SAFE  OUTSTANDING  NOTE
	// 2     epoch 1  assign epoch 1 from 100                  100
	// 3     epoch 1  deliver 100 103 108                      100   100 103 108
	// 4     epoch 1  complete 100 (epoch 1)   advanced        101   103 108      advanced to 101
	// 5     -        revoke                   commit 101      101   (103 108)    drain budget spent: commit 101; 103 and 108 will be replayed
	// 6     -        complete 103 (epoch 1)   not-owner       101   (103 108)    an epoch 1 worker finishes after the revoke: not-owner
	// 7     epoch 2  assign epoch 2 from 101                  101                the new owner starts from the committed 101
	// 8     epoch 2  deliver 103 108                          101   103 108
	// 9     epoch 2  complete 108 (epoch 1)   old-assignment  101   103 108      the old worker's 108: old-assignment, still 101
	// 10    epoch 2  complete 108 (epoch 2)   recorded        101   103 108✓     the new 108: recorded, still 101 (103 is unfinished)
	// 11    epoch 2  complete 103 (epoch 2)   advanced        109                advanced: 103 and 108 leave together, 109
	// 12    epoch 2  complete 108 (epoch 2)   duplicate       109                repeated notice: duplicate, stays 109
	//
	// safe offset after the last step: 109
	//
	// SAFE is the offset to commit: one past the contiguous completed prefix of the
	// delivered records. OUTSTANDING lists the delivered records not yet below it,
	// oldest first; ✓ marks a record that is complete but waits behind an
	// unfinished one; in parentheses, records of an ended epoch, which the next
	// owner replays. OWNER is the current epoch, or - when the partition is not
	// owned.
}
