package runner

import "context"

// Hooks for tests that measure the poll goroutine's per-event costs. They
// call loop methods directly, so they must not be used on a Runner whose
// Run has started.

// AssignForTest sets up assignments as the poll goroutine does on Assigned.
func AssignForTest(r *Runner, tps []TP) {
	if r.handlerCtx == nil {
		r.handlerCtx = context.Background()
	}
	for _, tp := range tps {
		r.assign(Assignment{TP: tp, Start: 0, Generation: NoGeneration}, nil)
	}
	r.flushFlow()
}

// BudgetForTest returns what Sink.Fetched would return.
func BudgetForTest(r *Runner) int { return r.budget() }

// PublishStatsForTest refreshes the Stats snapshot, as every tick does.
func PublishStatsForTest(r *Runner) { r.publishStats() }

// Sizes for the memory tests' logs.
var TaskAllocForTest, LaneAllocForTest = taskAlloc, laneAlloc

// DeliverForTest hands b to the runner as Sink.Fetched does (without
// dispatching it).
func DeliverForTest(r *Runner, b Batch) {
	r.deliver(&b)
	r.fitFree()
	r.flushFlow()
}

// ExactBudgetForTest is the budget computed by scanning every partition:
// the least room of an unpaused partition, at most high minus low.
func ExactBudgetForTest(r *Runner) int {
	b := r.cfg.highRecords - r.cfg.lowRecords
	for _, ps := range r.parts {
		if !ps.paused && !ps.revoking {
			b = min(b, r.room(ps))
		}
	}
	return max(b, 1)
}

// PollChunkForTest is the least room an unpaused partition keeps.
func PollChunkForTest(r *Runner) int { return r.pollChunk() }

// CompleteForTest takes up to n ready records and completes them as a
// worker would, except those stuck reports true for, which go back to the
// end of the ready queue. It returns how many it completed.
func CompleteForTest(r *Runner, n int, stuck func(Record) bool) int {
	done := 0
	var back queue
	for range n {
		t := r.ready.pop()
		if t == nil {
			break
		}
		if t.dropped {
			r.freeTask(t)
			continue
		}
		if stuck(t.rec) {
			back.push(t)
			continue
		}
		t.started = true
		t.ps.inflight++
		r.inflight++
		t.res = resHandled
		r.onDone(t)
		done++
	}
	for t := back.pop(); t != nil; t = back.pop() {
		r.ready.push(t)
	}
	r.flushFlow()
	return done
}

// MemoryForTest returns the runner's claim (its charge, and the reserve
// for the tracker rings' growth), what the free lists hold and the global
// limit.
func MemoryForTest(r *Runner) (claimed, free, pauseAt int64) {
	return r.claimed(), r.freeBytes, r.pauseAt
}

// TickForTest runs the periodic tick's memory trimming, and tells the
// source what it paused or resumed, as the loop does after every event.
func TickForTest(r *Runner) {
	r.trimFree()
	r.trimRings()
	r.flushFlow()
}
