package runner

// FreeListBytesForTest is the most the free lists keep.
func FreeListBytesForTest(r *Runner) int64 {
	return int64(r.freeCap()) * (taskAlloc + laneAlloc)
}

// Sizes for the memory tests' logs.
var TaskAllocForTest, LaneAllocForTest = taskAlloc, laneAlloc
