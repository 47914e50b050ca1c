package runner

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// task is one delivered record on its way through the runner. Tasks are
// owned by the poll goroutine, except between dispatch and completion, when
// exactly one worker holds them and the poll goroutine reads only the fields
// it set before dispatch. They are recycled through a free list, so a record
// costs no allocation in steady state.
type task struct {
	rec       Record
	route     *route
	ps        *partState
	epoch     rebalance.Epoch
	lane      *lane // nil in Unordered mode and for nil keys
	size      int64
	delivered time.Time

	// Set by the worker before it hands the task back.
	res result
	// fail is the last failed attempt, set by the worker as it happens (the
	// poll goroutine reads it for the oldest-unfinished stats).
	fail atomic.Pointer[failure]

	// batch is set on the first task of a batch (batch.go), which stands
	// for the batch in the work and done queues.
	batch *batch

	started bool // dispatched to a worker
	dropped bool // removed by a revoke, lost or shutdown before it started

	// outstanding list of its partition, in delivery order: the head is the
	// oldest unfinished record.
	prev, next *task
	// nextQ links the task in its lane's queue, the ready queue, the
	// workers' queue or the finished list: it is in one at a time.
	nextQ *task
}

// failure is a task's last failed attempt.
type failure struct {
	attempts int
	err      string
	kind     ErrorKind
}

// failure returns the message of t's last failed attempt, or "".
func (t *task) failure() string {
	if f := t.fail.Load(); f != nil {
		return f.err
	}
	return ""
}

// result is how a worker finished a task.
type result uint8

const (
	resHandled      result = iota // the handler succeeded
	resDeadLettered               // written to the dead-letter topic
	resSkipped                    // skipped by the Skip policy
	resCancelled                  // ctx ended first: not complete
	resFenced                     // the handler returned ErrFenced: not complete, and its lane holds
)

// queue is an intrusive FIFO of tasks linked through nextQ.
type queue struct {
	head, tail *task
	n          int
}

func (q *queue) push(t *task) {
	t.nextQ = nil
	if q.tail == nil {
		q.head = t
	} else {
		q.tail.nextQ = t
	}
	q.tail = t
	q.n++
}

func (q *queue) pop() *task {
	t := q.head
	if t == nil {
		return nil
	}
	q.head = t.nextQ
	if q.head == nil {
		q.tail = nil
	}
	t.nextQ = nil
	q.n--
	return t
}

// lane serializes the records of one key (KeyOrder) or one partition
// (PartitionOrder): at most one of its tasks is ready or in flight at a time.
type lane struct {
	key     uint64 // the key's hash (KeyOrder)
	busy    bool   // a task of the lane is ready or in flight, or the lane is held
	held    bool   // held by a fenced record until the partition's assignment ends
	flying  bool   // a batch holding its records is in flight, or it is held (batch_state.go)
	waiting queue

	// A KeyOrder lane that is not busy stays in its partition's map, a
	// cache for its key, and in the runner's list of idle lanes, newest
	// first (memory.go).
	ps           *partState
	newer, older *lane
}

// partState is the runner's state for one partition in one assignment. A
// new assignment gets a new partState, so a straggling task of an old
// assignment can never touch the lanes or counters of the new one.
type partState struct {
	p     *rebalance.Partition
	epoch rebalance.Epoch
	tp    TP

	ctx     context.Context // handlers' parent; cancelled on lost, drain timeout, close
	cancel  context.CancelFunc
	applied Applied  // from the assign hook; read by workers
	tel     *partTel // its telemetry attributes (telemetry.go); read by workers
	// first is ctx carrying attempt 1 (Attempt): the ctx of a record's
	// first attempt when tracing and the propagator leave ctx as it is,
	// so that it costs no allocation. It is never changed after assign:
	// a handler may give its ctx to what outlives the call.
	first attemptCtx

	// lanes holds KeyOrder's lanes by the hash of the key (seeded per
	// runner). Two keys whose 64-bit hashes collide share a lane: they run
	// one after the other, which costs parallelism, never order.
	lanes    map[uint64]*lane
	lanePeak int   // the most lanes since the map was made (shrinkLanes)
	held     int   // lanes held by fenced records
	lane     *lane // PartitionOrder

	count        int   // buffered + in flight
	bytes        int64 // what buffered and in-flight records are charged
	ringBytes    int64 // what its tracker ring is charged (setRing)
	ringReal     int64 // what its tracker ring takes
	inflight     int
	paused       bool // paused by this partition's water marks or its window
	windowWarned bool // paused with its window full, and logged
	srcPaused    bool // what the source was last told
	opPaused     bool // paused by an operator (operator.go)
	band         int  // its budget band (flow.go), or -1

	revoking bool        // dispatch stopped; waiting for the drain
	draining atomic.Bool // revoking, as workers see it: skip tasks not started
	closed   bool        // revoked or lost: the assignment is over

	pendingPos int64 // a fetch position to apply once nothing is outstanding
	hwm        int64 // the last high watermark a fetch reported
	fetched    int64 // the highest offset delivered in this assignment, or -1

	// Records of this assignment dead-lettered and fenced, for Stats.
	deadLettered, fencedN int64

	// The lowest record fenced in this assignment (-1: none): the safe
	// offset never passes it, and no task is left for it.
	fencedOff int64
	fencedAt  time.Time // when it was fetched
	fencedErr string
	fencedKey string // its key's printable form (printableKey)

	// The printable key of the oldest unfinished record at offset keyOff
	// (-1: none yet), kept for the stats snapshot: a record stuck for long
	// is shown every tick and its key formatted once.
	keyOff  int64
	keyText string

	oldest, newest *task // outstanding list

	batch *partBatch // a batch route's (batch_state.go), made at its first records
}

func (ps *partState) link(t *task) {
	t.prev, t.next = ps.newest, nil
	if ps.newest == nil {
		ps.oldest = t
	} else {
		ps.newest.next = t
	}
	ps.newest = t
}

func (ps *partState) unlink(t *task) {
	if t.prev == nil {
		ps.oldest = t.next
	} else {
		t.prev.next = t.next
	}
	if t.next == nil {
		ps.newest = t.prev
	} else {
		t.next.prev = t.prev
	}
	t.prev, t.next = nil, nil
}
