package runner

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"
)

// Batch handlers (docs/runner.md, "Batch handlers"). A topic registered
// with HandleBatch has its records handed to its BatchHandler in batches:
// the poll goroutine forms each batch from the ready records of one
// partition (batch_state.go), and one worker runs the handler once per
// batch under the topic's failure policy (batch_exec.go).

// Defaults of the batch options.
const (
	// DefaultBatchSize is BatchSize's default: Karafka's max_messages.
	DefaultBatchSize = 100
	// DefaultBatchWait is BatchWait's default: no wait, so a batch is what
	// is ready when a worker is free, and grows with the load.
	DefaultBatchWait = 0
)

// HandleBatch registers h for the records of topic, in batches of at most
// BatchSize records (default DefaultBatchSize) of one partition, each
// handed over once BatchSize of them are ready or the first has waited
// BatchWait (default 0: whatever is ready when a worker is free), with
// opts overriding the runner-wide options for them as for Handle.
//
// The order is the runner's Order, as for single records: in KeyOrder a
// batch may hold several keys of the partition and several records of a
// key, each key's in offset order, and no later record of a key in the
// batch runs before the batch returned; in PartitionOrder a batch is
// consecutive records of the partition and the next batch waits for it; in
// Unordered it is any of the partition's ready records. A batch holds its
// records in offset order and counts as one handler call against
// Concurrency.
//
// A nil error completes every record of the batch. A *BatchError names the
// first record that failed: the records before it complete, and the
// failure policy retries the batch from it; any other error (or a panic)
// fails the whole batch, which the policy retries as one. At the policy's
// end, the record a *BatchError named — or, for any other error, every
// record of the failed batch — is dead-lettered with its own headers, or
// skipped, and the records after it are handed over again. The commit
// passes a record only once the batch that holds it returned.
//
// A batch route's record is charged, against the water marks and
// MaxBufferedBytes, RecordOverhead and what it costs in its batch at most
// (336 bytes more with Go 1.26 on amd64). HandleBatch is refused
// over a Settler (a share group); registering a topic twice is an error
// from New.
func HandleBatch(topic string, h BatchHandler, opts ...HandleOption) Option {
	return func(c *config) {
		switch {
		case topic == "":
			c.errs = append(c.errs, errors.New("HandleBatch: empty topic"))
		case h == nil:
			c.errs = append(c.errs, fmt.Errorf("HandleBatch(%q): nil handler", topic))
		case c.handlers[topic] != nil:
			c.errs = append(c.errs, fmt.Errorf("HandleBatch(%q): topic registered twice", topic))
		default:
			rt := &route{topic: topic, batch: h, batchSize: DefaultBatchSize, batchWait: DefaultBatchWait}
			for _, o := range opts {
				if o != nil {
					o(rt)
				}
			}
			c.handlers[topic] = rt
		}
	}
}

// BatchSize sets the most records of a batch of a topic registered with
// HandleBatch (default DefaultBatchSize). It must be between 1 and the
// high water mark (WaterMarks): a partition never holds more. A size above
// the gap between the water marks fills only under backlog; BatchWait
// bounds the wait for it.
func BatchSize(n int) HandleOption {
	return func(r *route) { r.batchSize, r.batchSizeSet = n, true }
}

// BatchWait sets how long the first ready record of a partition may wait
// for its batch to fill to BatchSize before the runner hands over what is
// ready (default DefaultBatchWait, 0: hand over what is ready at once). It
// bounds the wait for a batch to fill, not for a free worker.
func BatchWait(d time.Duration) HandleOption {
	return func(r *route) { r.batchWait, r.batchWaitSet = d, true }
}

// BatchError is returned by a BatchHandler that handled the records of its
// batch before Index and failed at Index (of the slice it was given) with
// Err: the records before Index complete, and the failure policy retries
// the batch from Index, counting the attempts of the record at Index (as
// Spring Kafka's BatchListenerFailedException does). The kind of the error
// returned (Permanent or Transient, inside or around the BatchError;
// ErrFenced, ErrOutcomeUnknown) decides as for a single record, and the
// dead-letter headers name Err. An Index out of the slice's range fails
// the whole batch.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string {
	if e.Err == nil {
		return "runner: batch failed at record " + strconv.Itoa(e.Index)
	}
	return "runner: batch failed at record " + strconv.Itoa(e.Index) + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// batch is one batch on its way through the runner: its records' tasks in
// offset order, and the records the handler gets. It is made by the poll
// goroutine (formBatch), run by one worker (executeBatch), and taken back
// by the poll goroutine (onBatchDone); its first task is the one that
// travels through the work and done queues.
type batch struct {
	ps    *partState
	route *route
	tasks []*task
	recs  []Record // recs[i] is tasks[i].rec, for the handler
	lanes []*lane  // the lanes its records took (KeyOrder, PartitionOrder)

	// Set by the worker. The tasks before from are finished (their res
	// set); the rest are the part the next attempt runs.
	from int
	// actx is the handler's ctx on an attempt 1, carrying the attempt
	// number (Attempt); set once, never changed (a retry gets a new one).
	actx attemptCtx
	// When the first and the last failed attempt of the current part
	// ended.
	firstFail, lastFail time.Time
}

var batchAlloc = allocSize(int(unsafe.Sizeof(batch{})))

// batchRecordOverhead is what each record of a batch route is charged on
// top of RecordOverhead: what a batch of one costs — the batch, one
// Record slot for the handler, one task pointer and one lane pointer.
// It bounds what a record costs in a batch of any size: a batch of n
// allocates one batch and slices of n slots rounded up to their size class
// (at most a quarter more for the smallest, an eighth beyond), which the
// n-1 batches it saves more than pay for.
var batchRecordOverhead = batchAlloc + allocSize(int(unsafe.Sizeof(Record{}))) + 2*allocSize(8)

// batchRefusal is why New refuses HandleBatch over a Settler.
const batchRefusal = "batches are not supported over a share group: each record is acquired under a lock of its own, " +
	"which a batch waiting to fill, or retried as a whole, would hold past its time; use Handle"

// batchTopic returns a topic registered with HandleBatch, or "" when there
// is none; the first in name order, so an error naming it is stable.
func (c *config) batchTopic() string {
	for _, rt := range c.routes() {
		if rt.batch != nil {
			return rt.topic
		}
	}
	return ""
}
