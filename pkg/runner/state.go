package runner

import (
	"context"
	"hash/maphash"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// pollState is the state of the runner's poll goroutine: the partitions and
// their lanes, flow control, memory accounting, drains and commits. Nothing
// in it is touched by another goroutine.
type pollState struct {
	table        *rebalance.Table
	parts        map[TP]*partState
	ready        queue
	inflight     int   // tasks queued for or running on workers
	totalBytes   int64 // what buffered and in-flight records are charged (memory.go)
	ringBytes    int64 // what owned partitions' tracker rings are charged (setRing)
	ringReal     int64 // what owned partitions' tracker rings take (claimed)
	heldBytes    int64 // what lanes held by fenced records are charged
	totalCount   int
	pauseAt      int64 // the charge at which every partition pauses (globalLimits)
	bandCount    [bands]int
	globalPaused bool
	flowDirty    []*partState
	pauseBuf     []TP
	resumeBuf    []TP
	overhead     int64        // RecordOverhead(cfg.ordering)
	free         []*task      // see freeTask
	freeLanes    []*lane      // see freeLane
	freeBytes    int64        // what the free lists and the idle lanes hold
	freeLow      int          // the least len(free) since the last trimFree
	freeLanesLow int          // the least len(freeLanes) since then
	keySeed      maphash.Seed // hashes KeyOrder's keys into lanes
	drains       []*drain
	drainTimer   *time.Timer
	committing   *commitReq
	stopping     bool
	finished     bool
	drainErr     error
	pendingBuf   []rebalance.Commit
	handlerCtx   context.Context
	afterCommit  []chan sinkReply // Lost (or replacing Assigned) replies held until the commit in flight is answered

	// KeyOrder's idle lanes, newest first (pushIdle), and the most records
	// buffered and in flight at once since the last tick, and over the
	// tick interval before (idleCap).
	idleNewest, idleOldest *lane
	idleN                  int
	countPeak, countPrev   int
}
