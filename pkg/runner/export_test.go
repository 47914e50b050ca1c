package runner

import (
	"fmt"
)

// Hooks for tests that measure the poll goroutine's per-event costs. They
// call loop methods directly, so they must not be used on a Runner whose
// Run has started.

// AssignForTest sets up assignments as the poll goroutine does on Assigned.
func AssignForTest(r *Runner, tps []TP) {
	for _, tp := range tps {
		r.poll.assign(Assignment{TP: tp, Start: 0, Generation: NoGeneration}, nil)
	}
	r.poll.flushFlow()
	r.carryOut(&r.poll.acts)
}

// BudgetForTest returns what Sink.Fetched would return.
func BudgetForTest(r *Runner) int { return r.poll.budget() }

// PublishStatsForTest refreshes the Stats snapshot, as every tick does.
func PublishStatsForTest(r *Runner) { r.publishStats() }

// Sizes for the memory tests' logs.
var TaskAllocForTest, LaneAllocForTest = taskAlloc, laneAlloc

// DeliverForTest hands b to the runner as Sink.Fetched does (without
// dispatching it).
func DeliverForTest(r *Runner, b Batch) {
	r.poll.deliver(&b)
	r.poll.fitFree()
	r.poll.flushFlow()
	r.carryOut(&r.poll.acts)
}

// ExactBudgetForTest is the budget computed by scanning every partition:
// the least room of an unpaused partition, at most high minus low.
func ExactBudgetForTest(r *Runner) int {
	b := r.poll.cfg.highRecords - r.poll.cfg.lowRecords
	for _, ps := range r.poll.parts {
		if !ps.paused && !ps.revoking {
			b = min(b, r.poll.room(ps))
		}
	}
	return max(b, 1)
}

// PollChunkForTest is the least room an unpaused partition keeps.
func PollChunkForTest(r *Runner) int { return r.poll.pollChunk() }

// CompleteForTest takes up to n ready records and completes them as a
// worker would, except those stuck reports true for, which go back to the
// end of the ready queue. It returns how many it completed.
func CompleteForTest(r *Runner, n int, stuck func(Record) bool) int {
	done := 0
	var back queue
	for range n {
		t := r.poll.ready.pop()
		if t == nil {
			break
		}
		if t.dropped {
			r.poll.freeTask(t)
			continue
		}
		if stuck(t.rec) {
			back.push(t)
			continue
		}
		t.started = true
		t.ps.inflight++
		r.poll.inflight++
		t.res = resHandled
		r.poll.onDone(t)
		done++
	}
	for t := back.pop(); t != nil; t = back.pop() {
		r.poll.ready.push(t)
	}
	r.poll.flushFlow()
	r.carryOut(&r.poll.acts)
	return done
}

// MemoryForTest returns the runner's claim (its charge, and the reserve
// for the tracker rings' growth), what the free lists hold and the global
// limit.
func MemoryForTest(r *Runner) (claimed, free, pauseAt int64) {
	return r.poll.claimed(), r.poll.freeBytes, r.poll.pauseAt
}

// TickForTest runs the periodic tick's memory trimming, and tells the
// source what it paused or resumed, as the loop does after every event.
func TickForTest(r *Runner) {
	r.poll.trimMemory()
	r.poll.flushFlow()
	r.carryOut(&r.poll.acts)
}

// IdleLanesForTest returns how many idle key lanes the runner caches, and
// how many lanes the partitions' maps hold in all.
func IdleLanesForTest(r *Runner) (idle, lanes int) {
	for _, ps := range r.poll.parts {
		lanes += len(ps.lanes)
	}
	return r.poll.idleN, lanes
}

// StopDispatchForTest starts tp's drain as a revoke does: what has not
// started is dropped.
func StopDispatchForTest(r *Runner, tp TP) {
	r.poll.stopDispatch(r.poll.parts[tp])
	r.poll.flushFlow()
	r.carryOut(&r.poll.acts)
}

// CheckLanesForTest checks KeyOrder's lane accounting: every lane in a
// partition's map is busy or in the idle list (and only those are in it),
// a partition has no more busy lanes that no fenced record holds than
// records (each is charged one lane), and freeBytes is what the free lists
// and the idle list hold.
func CheckLanesForTest(r *Runner) error {
	listed := map[*lane]bool{}
	for l := r.poll.idleNewest; l != nil; l = l.older {
		listed[l] = true
	}
	if len(listed) != r.poll.idleN {
		return fmt.Errorf("the idle list holds %d lanes, idleN is %d", len(listed), r.poll.idleN)
	}
	for _, ps := range r.poll.parts {
		busy := 0
		for k, l := range ps.lanes {
			switch {
			case l.key != k || l.ps != ps:
				return fmt.Errorf("%s: lane of key %x under key %x, of partition %p", ps.tp, l.key, k, l.ps)
			case l.busy && listed[l]:
				return fmt.Errorf("%s: a busy lane is in the idle list", ps.tp)
			case !l.busy && !listed[l]:
				return fmt.Errorf("%s: an idle lane is not in the idle list", ps.tp)
			case l.busy && !l.held:
				busy++
			}
			delete(listed, l)
		}
		if busy > ps.count {
			return fmt.Errorf("%s: %d busy lanes for %d records", ps.tp, busy, ps.count)
		}
	}
	if len(listed) > 0 {
		return fmt.Errorf("%d idle lanes of no owned partition", len(listed))
	}
	if want := int64(len(r.poll.free))*taskAlloc + int64(len(r.poll.freeLanes))*laneAlloc + int64(r.poll.idleN)*laneCharge; r.poll.freeBytes != want {
		return fmt.Errorf("freeBytes %d, the free lists and idle lanes hold %d", r.poll.freeBytes, want)
	}
	return nil
}

// PrintableKeyForTest is the Stats' printable form of a key.
func PrintableKeyForTest(k []byte) string { return printableKey(k) }
