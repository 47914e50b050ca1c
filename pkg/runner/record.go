package runner

import (
	"context"
	"strconv"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// TP names one partition of one topic.
type TP = rebalance.TP

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one Kafka record handed to a Handler. Its Key, Value and
// Headers are the runner's own copy, in memory the runner allocated for
// this record alone: they share nothing with the client's buffers, and the
// runner never changes or reuses them, so a handler may keep a Record after
// returning. A handler must not modify them (a retry, or the dead-letter
// write, sees the same bytes). Topic may be shared.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	// LeaderEpoch is the partition leader epoch of the batch, or -1 when the
	// source does not know it.
	LeaderEpoch int32
	// DeliveryCount is the broker's count of deliveries of a share-group
	// record: 1 on its first delivery, more after a release or an expired
	// acquisition lock. It is 0 from sources that do not count deliveries.
	DeliveryCount int32
}

// TP returns the record's topic and partition.
func (r *Record) TP() TP { return TP{Topic: r.Topic, Partition: r.Partition} }

// String names the record as topic/partition@offset, the form every tidemark
// log line and error uses.
func (r *Record) String() string {
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "@" + strconv.FormatInt(r.Offset, 10)
}

// Header returns the value of the last header named key, and whether there
// was one.
func (r *Record) Header(key string) ([]byte, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// Handler processes one record. A nil error marks the record complete; an
// error (or a panic, which the runner recovers) is a failed attempt that the
// failure policy retries, dead-letters or skips. ctx is cancelled when the
// record's partition is lost, when a revoke or shutdown runs past its drain
// budget, on Close, and when the per-attempt timeout (if set) expires; a
// handler must return promptly once ctx is done.
type Handler func(ctx context.Context, rec Record) error

// Middleware wraps a Handler, for example to add the inbox, tracing or
// metrics of the caller's own.
type Middleware func(Handler) Handler

// Chain returns h wrapped by mw, the first middleware outermost:
// Chain(h, a, b) runs a(b(h)).
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// BatchHandler processes a batch of records of one partition, registered
// with HandleBatch, in offset order. A nil error completes every record of
// the batch; a *BatchError completes the records before its Index and
// fails the batch from there; any other error (or a panic) fails the whole
// batch, which the failure policy handles as one (see HandleBatch). ctx is
// cancelled as a Handler's is. The handler may keep the Records; the slice
// is the runner's, valid only until it returns.
type BatchHandler func(ctx context.Context, recs []Record) error
