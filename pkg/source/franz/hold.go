package franz

import (
	"context"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// hold is what Run took from the client and has not handed to the runner
// yet: the records of this poll (held), those of paused partitions from
// earlier polls (parked), and the partitions whose records did not fit in
// parked and are fetched again (refetch).
//
// Run takes everything the client fetched at once (see Run) and hands it
// to the runner within the runner's budget (handOver). mu guards what it
// took and has not handed over yet. Every method takes mu and releases it
// before it returns, and none holds it across a call into the runner or
// across I/O: the runner calls Pause and Resume while Run waits in
// Sink.Fetched, and the client's callbacks drop partitions meanwhile. mu
// is held across the client's SetOffsets (polled), which sends no request
// (see polled for what it waits for, and why it stays under mu). mu is
// taken before flow's lock, never after; Pause and Resume take only
// flow's, so they never wait for mu.
//
// No record of an ended assignment reaches the runner after it heard of
// the end: the revoke, loss and assign callbacks drop the records of
// their partitions (drop) before they tell the runner. drop removes them
// under mu, so no hand-over taken after it has any; and if the one
// hand-over that can be in Sink.Fetched at that moment (only Run's
// goroutine hands over) has records of them, drop waits, without mu,
// until Fetched returned. A drop of partitions not in it does not wait.
type hold struct {
	cl   *kgo.Client // sets the fetch position of refetched partitions back
	flow *flow       // told what is parked or refetched

	mu     sync.Mutex
	held   []runner.Batch            // this poll's records not handed over yet
	orig   []runner.Batch            // this poll's batches, reused once all is handed over
	parked map[runner.TP]*parkedPart // records of paused partitions from earlier polls
	out    []runner.Batch            // reused for each hand-over
	// parkedBytes is what parked holds (parkedSize), at most parkLimit
	// (LimitFetch; unlimited until then): records of a partition that do
	// not fit are dropped and fetched again (see park).
	parkedBytes, parkLimit int64
	// refetch maps partitions whose records park dropped to the offset
	// the client must fetch them from again (polled, after the next
	// poll); flow keeps them paused at the client until then.
	refetch map[runner.TP]int64
	// handing is set while a hand-over is in Sink.Fetched, and names its
	// partitions (reused for each); waiter, made by the first drop that
	// waits for it, is closed when Fetched returned.
	handing bool
	handTPs []runner.TP
	waiter  chan struct{}
	// cand and candPaused are take's, reused: the partitions it may take
	// records of and whether the runner paused them.
	cand       []runner.TP
	candPaused []bool
}

func newHold(cl *kgo.Client, fl *flow) *hold {
	return &hold{
		cl:        cl,
		flow:      fl,
		parked:    map[runner.TP]*parkedPart{},
		parkLimit: math.MaxInt64,
		refetch:   map[runner.TP]int64{},
	}
}

// parkedPart is a paused partition's records that Run took from the client
// and could not hand over before its next poll, deep-copied out of the
// poll's buffers (see parkedCopy), with the position after them and the
// high watermark.
type parkedPart struct {
	recs  []runner.Record
	pos   int64
	hwm   int64
	bytes int64 // parkedSize of everything parked for it, until all is handed over
}

// holding reports whether records of this poll are still held.
func (h *hold) holding() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.held {
		if h.held[i].Position >= 0 {
			return true
		}
	}
	return false
}

// handOver hands up to budget held records of unpaused partitions to sink
// (Sink.Fetched), parked ones first (they are older), and returns the
// runner's answer; handed is false, and sink is not called, when there is
// nothing to hand over. A batch's position goes with its last record,
// never before, so the runner cannot move a partition's safe offset past a
// record it has not seen. mu is not held while Fetched runs (see hold).
func (h *hold) handOver(ctx context.Context, sink runner.Sink, budget int) (n int, handed bool, err error) {
	out := h.take(budget)
	if out == nil {
		return 0, false, nil
	}
	n, err = sink.Fetched(ctx, out)
	h.mu.Lock()
	h.handing = false
	if h.waiter != nil {
		close(h.waiter)
		h.waiter = nil
	}
	h.mu.Unlock()
	return n, true, err
}

// take takes the records of handOver out of what is held and marks them
// handing; nil when there is nothing to hand over.
func (h *hold) take(budget int) []runner.Batch {
	h.mu.Lock()
	// The partitions with records to hand over, parked ones first, and
	// which of them the runner paused, asked of flow at once.
	cand := h.cand[:0]
	for tp := range h.parked {
		cand = append(cand, tp)
	}
	nparked := len(cand)
	for i := range h.held {
		if h.held[i].Position >= 0 {
			cand = append(cand, h.held[i].TP)
		}
	}
	paused := h.flow.pausedOf(cand, h.candPaused[:0])
	h.cand, h.candPaused = cand, paused
	out := h.out[:0]
	left := budget
	for i, tp := range cand[:nparked] {
		if left == 0 || paused[i] {
			continue
		}
		pp := h.parked[tp]
		k := min(left, len(pp.recs))
		b := runner.Batch{TP: tp, Records: pp.recs[:k:k], Position: -1, HighWatermark: pp.hwm}
		pp.recs, left = pp.recs[k:], left-k
		if len(pp.recs) == 0 {
			b.Position = pp.pos
			delete(h.parked, tp)
			h.parkedBytes -= pp.bytes
			h.flow.setParked(tp, false) // fetched again from the next poll
		}
		out = append(out, b)
	}
	next := nparked
	for i := range h.held {
		b := &h.held[i]
		if b.Position < 0 {
			continue // handed over
		}
		isPaused := paused[next]
		next++
		if isPaused || h.parked[b.TP] != nil || (left == 0 && len(b.Records) > 0) {
			continue // paused, or older records first
		}
		k := min(left, len(b.Records))
		ob := runner.Batch{TP: b.TP, Records: b.Records[:k:k], Position: -1, HighWatermark: b.HighWatermark}
		b.Records, left = b.Records[k:], left-k
		if len(b.Records) == 0 {
			ob.Position, b.Position = b.Position, -1
		}
		out = append(out, ob)
	}
	h.out = out
	if len(out) == 0 {
		h.mu.Unlock()
		return nil
	}
	h.handing = true
	h.handTPs = h.handTPs[:0]
	for i := range out {
		h.handTPs = append(h.handTPs, out[i].TP)
	}
	h.mu.Unlock()
	return out
}

// park copies what is still held (records of paused partitions) out of the
// poll's buffers into parked, and returns the poll's batches, whose record
// buffers the next poll may reuse (Source.reuse): the copies share no
// memory with the fetch, so once the runner has copied what it was handed,
// nothing keeps the fetch's buffers alive.
//
// What is parked is bounded by parkLimit. A partition's records that do not
// fit are dropped, and the client fetches them again from the first of them
// once the partition is resumed (refetch, applied after the next poll). So
// the bound never blocks anything: a paused partition waits for the runner
// to resume it, parked or not, and a resumed one is fetched again; records
// are never lost or repeated, since the runner saw none of the dropped ones
// and no position past them.
func (h *hold) park() (orig []runner.Batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.held {
		b := &h.held[i]
		if b.Position < 0 {
			continue
		}
		size := parkedSize(b.Records)
		if h.parkedBytes+size > h.parkLimit {
			h.refetch[b.TP] = b.Records[0].Offset // size > 0: there are records
			h.flow.setRefetch(b.TP)
			continue
		}
		pp := h.parked[b.TP]
		if pp == nil {
			pp = &parkedPart{pos: -1, hwm: -1}
			h.parked[b.TP] = pp
			h.flow.setParked(b.TP, true) // not fetched while parked
		}
		pp.recs = parkedCopy(pp.recs, b.Records)
		pp.pos, pp.hwm = max(pp.pos, b.Position), max(pp.hwm, b.HighWatermark)
		pp.bytes += size
		h.parkedBytes += size
	}
	orig = h.orig
	// Whole arrays, not only up to len: entries past it, from earlier
	// polls with more partitions, would keep their records and so their
	// fetches alive.
	clear(h.held[:cap(h.held)])
	h.held, h.orig = h.held[:0], nil
	clear(h.out[:cap(h.out)])
	return orig
}

// polled makes batches, one poll's records, what is held, and sets the
// fetch position of the partitions whose records park dropped back to the
// first of them. Run calls it after the poll, with every record handed
// over or parked (park), and before AllowRebalance: franz-go's SetOffsets
// must not race a revoke, and the callbacks drop a partition's refetch
// (drop) under mu before anything else.
func (h *hold) polled(batches []runner.Batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held, h.orig = append(h.held[:0], batches...), batches
	if len(h.refetch) == 0 {
		return
	}
	set := make(map[string]map[int32]kgo.EpochOffset)
	tps := make([]runner.TP, 0, len(h.refetch))
	for tp, off := range h.refetch {
		if set[tp.Topic] == nil {
			set[tp.Topic] = make(map[int32]kgo.EpochOffset)
		}
		// Epoch -1: no truncation check for a position the client had
		// already reached.
		set[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: off}
		tps = append(tps, tp)
	}
	clear(h.refetch)
	// SetOffsets under mu, so that a drop of these partitions (which
	// takes mu) comes wholly before or after it: a drop that went between
	// taking refetch and SetOffsets could see the offsets set after the
	// partition was assigned anew, where franz-go would start the new
	// assignment from them instead of its committed offset. This holds
	// no lock across I/O: in franz-go v1.22.3 SetOffsets sends no request.
	// It takes the consumer's and the group's locks (held elsewhere in the
	// client only for in-memory work), cancels the consumer session, waits
	// for the session's fetch and offset-loading goroutines to stop (their
	// requests end at once: franz-go sets the connection's deadline to
	// now when a request's ctx ends), and starts a new one. None of those
	// goroutines calls into the source but for the fetch-batch hook,
	// which takes only limMu; and the callbacks, the only other takers of
	// mu, run under none of those locks (franz-go calls them outside
	// them).
	h.cl.SetOffsets(set)
	h.flow.refetched(tps) // may be fetched again from the next poll
}

// setParkLimit bounds the bytes parked records may take (LimitFetch).
func (h *hold) setParkLimit(n int64) {
	h.mu.Lock()
	h.parkLimit = n
	h.mu.Unlock()
}

// parkedSize is what parking recs costs: their keys, values and header
// values, and their runner.Record and runner.Header structures.
func parkedSize(recs []runner.Record) int64 {
	n := int64(len(recs)) * int64(unsafe.Sizeof(runner.Record{}))
	for i := range recs {
		n += int64(len(recs[i].Key) + len(recs[i].Value))
		for _, h := range recs[i].Headers {
			n += int64(len(h.Value)) + int64(unsafe.Sizeof(runner.Header{}))
		}
	}
	return n
}

// drop forgets the records held for tps, whose assignment ended or is new:
// they were never handed to the runner, and whoever owns the partitions
// next fetches them again. It returns once none of their records can reach
// the runner any more: if the hand-over in Sink.Fetched has some, once
// Fetched returned (see hold). O(held + tps).
func (h *hold) drop(tps []runner.TP) {
	drop := make(map[runner.TP]bool, len(tps))
	for _, tp := range tps {
		drop[tp] = true
	}
	h.mu.Lock()
	for i := range h.held {
		if b := &h.held[i]; drop[b.TP] {
			b.Records, b.Position = nil, -1
		}
	}
	for _, tp := range tps {
		if pp := h.parked[tp]; pp != nil {
			h.parkedBytes -= pp.bytes
		}
		delete(h.parked, tp)
		delete(h.refetch, tp)
	}
	h.flow.forget(tps)
	var wait chan struct{}
	if h.handing && slices.ContainsFunc(h.handTPs, func(tp runner.TP) bool { return drop[tp] }) {
		if h.waiter == nil {
			h.waiter = make(chan struct{})
		}
		wait = h.waiter
	}
	h.mu.Unlock()
	if wait != nil {
		<-wait
	}
}

// parkedCopy appends recs to dst with their keys, values and headers copied
// into one new allocation (and their headers into one more), so that they
// share no memory with the fetch they came from. A nil key or value stays
// nil, an empty one stays empty.
func parkedCopy(dst, recs []runner.Record) []runner.Record {
	var n, nh int
	for i := range recs {
		n += len(recs[i].Key) + len(recs[i].Value)
		for _, h := range recs[i].Headers {
			n += len(h.Value)
		}
		nh += len(recs[i].Headers)
	}
	dst = slices.Grow(dst, len(recs)) // no more than parkedSize counts
	buf := make([]byte, 0, n)
	var hs []runner.Header
	if nh > 0 {
		hs = make([]runner.Header, 0, nh)
	}
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		i := len(buf)
		buf = append(buf, b...)
		return buf[i:len(buf):len(buf)]
	}
	for _, r := range recs {
		r.Key, r.Value = take(r.Key), take(r.Value)
		if len(r.Headers) > 0 {
			i := len(hs)
			for _, h := range r.Headers {
				// Header keys are strings: franz-go copied them out of
				// the fetch already.
				hs = append(hs, runner.Header{Key: h.Key, Value: take(h.Value)})
			}
			r.Headers = hs[i:len(hs):len(hs)]
		}
		dst = append(dst, r)
	}
	return dst
}
