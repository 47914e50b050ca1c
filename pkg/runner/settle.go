package runner

import (
	"fmt"
	"slices"
	"strconv"
)

// Settler is implemented by a Source that settles each record with its
// broker instead of committing offsets: a share group (KIP-932), where
// records of one partition reach many members, out of offset order, and
// come again at offsets below ones already delivered. Over a Settler the
// runner runs in settled mode: it does not track offsets (no watermark, no
// commit: Source.Commit is never called), and it tells the source how
// every record it was handed left it.
//
// The source reports each partition once with Sink.Assigned before its
// first records (no Revoked or Lost follow) and must never have two
// records with the same partition and offset in the runner at once: a
// second delivery of a record the runner still holds stays with the
// source, which settles it as the first one is settled.
//
// Settle is called once for every record the runner took in Sink.Fetched,
// from the runner's poll goroutine: it must not block (no I/O, no lock held
// across one). It is not called for records still running when Run ends;
// the source settles those as Released in Close. A record the runner took
// is never settled twice.
type Settler interface {
	Settle(tp TP, offset int64, s Settlement)
}

// Settlement is how a record left the runner in settled mode.
type Settlement uint8

const (
	// Accepted: the handler succeeded, the Applied filter found the record
	// applied, or the DeadLetter policy wrote it and the write was
	// acknowledged. The record is done.
	Accepted Settlement = iota + 1
	// Rejected: the failure policy (Skip) gave up on the record after its
	// attempts. The broker must not deliver it again.
	Rejected
	// Released: the record did not finish here — stopped before it ran, or
	// cancelled by a shutdown past its drain budget or by Close, or fenced.
	// The broker should deliver it again.
	Released
)

func (s Settlement) String() string {
	switch s {
	case Accepted:
		return "accepted"
	case Rejected:
		return "rejected"
	case Released:
		return "released"
	}
	return fmt.Sprintf("Settlement(%d)", uint8(s))
}

// settledOptions refuses, over a Settler, the options that mean nothing
// there, and makes Unordered the default order. It runs before validate, so
// it sees the options as the user gave them. Options compared with their
// defaults are refused only when given another value.
func (c *config) settledOptions(src Source) error {
	if _, ok := src.(Settler); !ok {
		return nil
	}
	d := defaults()
	refuse := func(opt, reason string) error {
		return &ConfigError{Option: opt, Reason: reason + " (the source settles records one by one: a share group)"}
	}
	switch {
	case c.orderSet && c.ordering != Unordered:
		return refuse("Order", c.ordering.String()+" order is not kept across a share group's members, and one member's order means nothing to the others; use Unordered (the default here)")
	case c.blockedTopic() != "":
		opt := "Failure"
		if t := c.blockedTopic(); c.handlers[t].policySet {
			opt = "Handle(" + strconv.Quote(t) + ").WithPolicy"
		}
		return refuse(opt, "Block (the default) retries a record forever while its lock is renewed, holding it from every member and stalling its session; choose Skip(n), which rejects it after n attempts, or DeadLetter")
	case c.policy.kind == policyBlock:
		// Every topic has a policy of its own, but a record of a topic
		// none registered runs under the runner-wide one.
		return refuse("Failure", "Block (the default) is the policy of records of a topic no Handle registered, retried forever while their locks are renewed; choose Skip(n) or DeadLetter")
	case c.commitInterval != d.commitInterval:
		return refuse("CommitInterval", "there are no offsets to commit")
	case c.commitTimeout != d.commitTimeout:
		return refuse("CommitTimeout", "there are no offsets to commit")
	case c.window != 0:
		return refuse("Window", "there is no committed offset for a window to hold back")
	case c.assignHook != nil:
		return refuse("OnAssign", "there are no assignments, no partition owner and no lease")
	case c.batchTopic() != "":
		return refuse("HandleBatch("+strconv.Quote(c.batchTopic())+")", batchRefusal)
	}
	c.ordering = Unordered
	return nil
}

// blockedTopic returns a registered topic whose records would run under
// Block (its own policy, or the runner-wide one it did not override), or
// "" when there is none; the first in name order, so the error is stable.
func (c *config) blockedTopic() string {
	var topics []string
	for t, rt := range c.handlers {
		if (rt.policySet && rt.policy.kind == policyBlock) || (!rt.policySet && c.policy.kind == policyBlock) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return ""
	}
	slices.Sort(topics)
	return topics[0]
}

// settlement is one record's Settle call, for the loop to make
// (actions.settlements).
type settlement struct {
	tp     TP
	offset int64
	s      Settlement
}

// track records a delivery in ps's tracker, or nothing in settled mode,
// where offsets arrive in any order and again. A record with a delivery
// count (a share group's) has it measured (tidemark.record.delivery_count,
// tidemark.records.redelivered) once the runner takes it.
func (s *pollState) track(ps *partState, rec *Record) error {
	if !s.settled {
		if err := ps.p.Deliver(rec.Offset); err != nil {
			return err
		}
	}
	if rec.DeliveryCount > 0 {
		s.tel.delivered(rec.Topic, rec.DeliveryCount)
	}
	return nil
}

// settleDone settles a finished task in settled mode; it reports whether
// it did (then the tracker is not told).
func (s *pollState) settleDone(t *task) bool {
	if !s.settled {
		return false
	}
	how := Released
	switch t.res {
	case resHandled, resDeadLettered:
		how = Accepted
	case resSkipped:
		how = Rejected
	}
	s.acts.settlements = append(s.acts.settlements, settlement{t.ps.tp, t.rec.Offset, how})
	return true
}

// settleDropped settles, in settled mode, a task dropped before it ran.
func (s *pollState) settleDropped(t *task) {
	if s.settled {
		s.acts.settlements = append(s.acts.settlements, settlement{t.ps.tp, t.rec.Offset, Released})
	}
}

// firstUnfinished is what a *DrainError names for ps, which has records
// still running: its safe offset (the first unfinished record, where the
// next owner starts), or in settled mode, where there is none, the lowest
// offset of those records.
func (s *pollState) firstUnfinished(ps *partState) int64 {
	if !s.settled {
		return ps.p.Safe()
	}
	low := int64(-1)
	for t := ps.oldest; t != nil; t = t.next {
		if t.started && (low < 0 || t.rec.Offset < low) {
			low = t.rec.Offset
		}
	}
	return low
}
