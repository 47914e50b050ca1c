package franz

import (
	"context"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Own records tp as assigned under member, as onAssigned does.
func (s *Source) Own(tp runner.TP, member string) {
	s.own.assign(member, []runner.TP{tp})
}

// Admit runs the ownership check franz-go runs just before it issues a
// commit request; answered marks the request answered.
func (s *Source) Admit(req *kmsg.OffsetCommitRequest) (answered func(), refused []runner.TP) {
	sent, refused := s.own.admit(req)
	if sent == nil {
		return func() {}, refused
	}
	return func() { s.own.settle(sent) }, refused
}

// Lose is franz-go's OnPartitionsLost callback for tps.
func (s *Source) Lose(tps []runner.TP) {
	s.onLost(context.Background(), s.cl, mapOf(tps))
}

// FlowCalls counts the client's PauseFetchPartitions and
// ResumeFetchPartitions calls from now on. Call it before Run.
type FlowCalls struct {
	fetchControl
	Pauses, Resumes atomic.Int64
}

func (c *FlowCalls) PauseFetchPartitions(m map[string][]int32) map[string][]int32 {
	c.Pauses.Add(1)
	return c.fetchControl.PauseFetchPartitions(m)
}

func (c *FlowCalls) ResumeFetchPartitions(m map[string][]int32) {
	c.Resumes.Add(1)
	c.fetchControl.ResumeFetchPartitions(m)
}

// CountFlowCalls makes s count its flow control calls to the client.
func (s *Source) CountFlowCalls() *FlowCalls {
	c := &FlowCalls{fetchControl: s.flow.fc}
	s.flow.fc = c
	return c
}

// ApplyFlow tells the client what changed in the partitions to fetch, as
// Run does before each poll.
func (s *Source) ApplyFlow() {
	s.flow.mu.Lock()
	s.flow.applyLocked()
	s.flow.mu.Unlock()
}

// Hold makes batches the records held, as a poll that returned them would,
// and DropHeld drops those of drop, as a revoke does.
func (s *Source) Hold(batches []runner.Batch) {
	h := s.hold
	h.mu.Lock()
	h.held = append(h.held[:0], batches...)
	h.mu.Unlock()
}

func (s *Source) DropHeld(drop []runner.TP) { s.hold.drop(drop) }

// Park makes batches this poll's records, all of them still held (their
// partitions paused), and parks them as Run does before its next poll. It
// returns what is parked for each partition, and the records the reusable
// buffers still hold (they are cleared when reused).
func (s *Source) Park(batches []runner.Batch) (parked map[runner.TP][]runner.Record, pinned int) {
	s.Pause(tpsOfBatches(batches))
	h := s.hold
	h.mu.Lock()
	h.held, h.orig = append(h.held[:0], batches...), batches
	h.mu.Unlock()
	s.reuse(h.park())
	parked = map[runner.TP][]runner.Record{}
	h.mu.Lock()
	for tp, pp := range h.parked {
		parked[tp] = pp.recs
	}
	h.mu.Unlock()
	for _, b := range s.recBufs {
		for _, r := range b[:cap(b)] {
			if r.Key != nil || r.Value != nil || r.Headers != nil {
				pinned++
			}
		}
	}
	return parked, pinned
}

func tpsOfBatches(bs []runner.Batch) []runner.TP {
	tps := make([]runner.TP, len(bs))
	for i, b := range bs {
		tps[i] = b.TP
	}
	return tps
}

// SetParkLimit bounds the bytes parked records may take (LimitFetch sets
// it from FetchLimits).
func (s *Source) SetParkLimit(n int64) {
	s.hold.setParkLimit(n)
}

// ParkedBytes is what the parked records take, counted as park counts it.
func (s *Source) ParkedBytes() int64 {
	h := s.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, pp := range h.parked {
		n += parkedSize(pp.recs)
	}
	return n
}

// ParkedSize is what parking recs costs.
func ParkedSize(recs []runner.Record) int64 { return parkedSize(recs) }

// HandOver is one hand-over of Run's loop: what is held for unpaused
// partitions, up to budget records, to sink. handed is false when nothing
// was held.
func (s *Source) HandOver(ctx context.Context, sink runner.Sink, budget int) (n int, handed bool, err error) {
	return s.hold.handOver(ctx, sink, budget)
}

// Ownership is the source's record of the partitions it owns, for its
// unit tests; the methods below call ownership's.
type Ownership = ownership

func NewOwnership() *Ownership { return newOwnership() }

func (o *ownership) Assign(member string, tps []runner.TP) []runner.TP { return o.assign(member, tps) }
func (o *ownership) Rejoin(member string, tps, unread []runner.TP)     { o.rejoin(member, tps, unread) }
func (o *ownership) AssignedBefore(member string, tps []runner.TP) (rest, earlier []runner.TP) {
	return o.assignedBefore(member, tps)
}
func (o *ownership) Count() int             { return o.count() }
func (o *ownership) Disown(tps []runner.TP) { o.disown(tps) }

// Admit is admit; answered is settle for what it let through.
func (o *ownership) Admit(req *kmsg.OffsetCommitRequest) (answered func(), refused []runner.TP) {
	sent, refused := o.admit(req)
	if sent == nil {
		return nil, refused
	}
	return func() { o.settle(sent) }, refused
}

// FloorVerdict is what ApplyFloors decided for one offset.
type FloorVerdict struct {
	TP       runner.TP
	Withheld bool
	Err      error
	Log      bool
}

// ForCommit is Commit's use of ownership without the broker: forCommit,
// then, for the floored offsets, applyFloors with read standing for the
// group's committed offsets (called only when a floor is unread, as
// Commit reads them only then; reads reports whether it was called).
func (o *ownership) ForCommit(member string, offsets []runner.Offset, read func(runner.TP) (int64, error)) (owned []runner.Offset, notOwned []runner.TP, floors []FloorVerdict, reads bool) {
	owned, notOwned, fl := o.forCommit(member, offsets)
	if len(fl) == 0 {
		return owned, notOwned, nil, false
	}
	var rs map[runner.TP]floorRead
	if o.floorsUnread(fl) {
		reads = true
		rs = map[runner.TP]floorRead{}
		for tp := range fl {
			at, err := read(tp)
			rs[tp] = floorRead{at: at, err: err}
		}
	}
	var floored []runner.Offset
	for _, off := range owned {
		if fl[off.TP] != nil {
			floored = append(floored, off)
		}
	}
	for _, v := range o.applyFloors(fl, floored, rs) {
		floors = append(floors, FloorVerdict{TP: v.tp, Withheld: v.withhold, Err: v.err, Log: v.logNow})
	}
	return owned, notOwned, floors, reads
}
