package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Operator pauses: Spring's container pause, for a partition or a whole
// topic. An operator pause stops fetching from the partition, as flow
// control's does; records already fetched still run and commit. It is the
// operator's until the operator resumes it:
//
//   - flow control never resumes it: the source is told to resume a
//     partition only when no reason to pause it is left (flushFlow), and
//     the operator's is one;
//   - it survives a rebalance in this process: the pauses are kept by
//     topic and partition, not by assignment, so a partition revoked and
//     assigned back (or assigned for the first time after the pause) starts
//     paused, before the source's next fetch. This is what Spring does
//     (its paused partitions are paused again after a rebalance).
//
// It is not a group-wide pause: a paused partition that moves to another
// member is consumed there, and a restart forgets every pause (they are
// kept in memory only). Pause every member, or stop the consumers, to stop
// a topic everywhere.
//
// Every change goes through the poll goroutine, which owns the source's
// Pause and Resume calls: the methods below send it a request on the
// channel the source's reports use, and wait for its answer. So the
// poll loop's select has no case more, and the hot path pays nothing.

// ErrNotHandled is returned (wrapped, naming the topic) by the operator's
// pause and resume methods for a topic this runner has no handler for: a
// pause for it would never apply to anything.
var ErrNotHandled = errors.New("runner: topic has no handler")

// ErrPauseShared is returned (wrapped, naming what was asked) by
// PausePartitions and PauseTopics over a Settler source (a share group).
// There the broker decides which records each member gets, and the share
// source cannot leave one partition out of its fetches: it stops polling
// altogether while any partition is paused, so a pause of one partition or
// topic would stop every one. It refuses rather than stop more than it was
// asked to; to stop a share consumer, stop it (or scale it down).
var ErrPauseShared = errors.New("runner: a share group's source cannot pause one partition or topic alone")

// OperatorPauses is what an operator paused: whole topics, and single
// partitions (of topics not paused as a whole), each sorted. Partitions
// need not be owned: a pause of a partition another member owns applies
// when it is assigned here.
type OperatorPauses struct {
	Topics     []string
	Partitions []TP
}

// opCmd is one operator request, answered by the poll goroutine.
type opCmd struct {
	pause  bool
	topics []string
	tps    []TP
	view   OperatorPauses // the pauses after the request, set by the poll goroutine
	seq    uint64         // which request of the poll goroutine's it was
}

// String names what c asks for, for errors: "partitions t/0 t/1", "topics t".
func (c *opCmd) String() string {
	var b strings.Builder
	if len(c.tps) > 0 {
		b.WriteString("partitions")
		for _, tp := range c.tps {
			b.WriteString(" " + tp.String())
		}
	}
	if len(c.topics) > 0 {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString("topics " + strings.Join(c.topics, " "))
	}
	return b.String()
}

// opState is the poll goroutine's record of the operator's pauses.
type opState struct {
	topics map[string]bool
	parts  map[TP]bool
	seq    uint64 // requests applied
}

// paused reports whether the operator paused tp, or its topic.
func (o *opState) paused(tp TP) bool {
	return o.topics[tp.Topic] || o.parts[tp]
}

// opView is the last OperatorPauses the poll goroutine reported, for
// OperatorPaused; seq orders concurrent requests' answers.
type opView struct {
	mu   sync.Mutex
	seq  uint64
	view OperatorPauses
}

// PausePartitions pauses fetching from tps until ResumePartitions (or
// ResumeTopics of their topic): an operator's pause, which flow control
// never lifts and a rebalance keeps (see the package's operator notes
// above). Records already fetched still run and are committed. A partition
// not owned now is paused when it is assigned. It blocks until the poll
// goroutine applied the pause (the source was told, and Stats shows it)
// or ctx is done; before
// Run it waits for Run. It returns an error wrapping ErrNotHandled for a
// topic without a handler, ErrStopped once the runner stopped (or while it
// stops), an error wrapping ErrPauseShared over a share group's source,
// or ctx.Err(). It is safe for concurrent use.
func (r *Runner) PausePartitions(ctx context.Context, tps ...TP) error {
	return r.operate(ctx, &opCmd{pause: true, tps: tps})
}

// ResumePartitions lifts the operator's pause of tps, as PausePartitions
// describes. A partition the operator did not pause is left as it is (no
// error). A partition whose topic is paused as a whole is an error: resume
// the topic. Flow control may keep a resumed partition paused until it
// falls to its low water marks.
func (r *Runner) ResumePartitions(ctx context.Context, tps ...TP) error {
	return r.operate(ctx, &opCmd{tps: tps})
}

// PauseTopics pauses every partition of topics, those owned now and those
// assigned later, until ResumeTopics; otherwise as PausePartitions.
func (r *Runner) PauseTopics(ctx context.Context, topics ...string) error {
	return r.operate(ctx, &opCmd{pause: true, topics: topics})
}

// ResumeTopics lifts the operator's pauses of topics: the whole-topic
// pause and those of single partitions of them. Otherwise as
// ResumePartitions.
func (r *Runner) ResumeTopics(ctx context.Context, topics ...string) error {
	return r.operate(ctx, &opCmd{topics: topics})
}

// OperatorPaused returns what the operator paused, as of the last pause or
// resume applied. It does not block and is safe for concurrent use.
func (r *Runner) OperatorPaused() OperatorPauses {
	r.opView.mu.Lock()
	defer r.opView.mu.Unlock()
	v := r.opView.view
	return OperatorPauses{Topics: slices.Clone(v.Topics), Partitions: slices.Clone(v.Partitions)}
}

// operate validates c and has the poll goroutine apply it.
func (r *Runner) operate(ctx context.Context, c *opCmd) error {
	what := "resume"
	if c.pause {
		what = "pause"
	}
	for _, t := range c.topics {
		if r.cfg.handlers[t] == nil {
			return fmt.Errorf("runner: %s topic %q: %w", what, t, ErrNotHandled)
		}
	}
	for _, tp := range c.tps {
		if r.cfg.handlers[tp.Topic] == nil {
			return fmt.Errorf("runner: %s partition %s: %w", what, tp, ErrNotHandled)
		}
		if tp.Partition < 0 {
			return fmt.Errorf("runner: %s partition %s: negative partition", what, tp)
		}
	}
	if _, settled := r.src.(Settler); settled && c.pause {
		return fmt.Errorf("runner: pause %s: %w", c, ErrPauseShared)
	}
	if r.state.Load() == lifeStopped {
		return ErrStopped
	}
	req := &sinkReq{kind: sinkOperator, op: c}
	if _, err := (sinkOf{r}).call(ctx, req); err != nil {
		return err
	}
	r.opView.mu.Lock()
	defer r.opView.mu.Unlock()
	if c.seq > r.opView.seq { // else a later request's answer came first
		r.opView.seq, r.opView.view = c.seq, c.view
	}
	return nil
}

// operate applies an operator's request and answers it: the partitions
// whose pause changed are marked dirty, and the settle after this event
// tells the source.
func (s *pollState) operate(req *sinkReq) {
	c := req.op
	o := &s.ops
	if o.topics == nil {
		o.topics, o.parts = map[string]bool{}, map[TP]bool{}
	}
	var err error
	if !c.pause {
		for _, tp := range c.tps {
			if o.topics[tp.Topic] {
				err = fmt.Errorf("runner: resume partition %s: its topic %q is paused as a whole; resume the topic", tp, tp.Topic)
				break
			}
		}
	}
	if err == nil {
		for _, t := range c.topics {
			if c.pause {
				o.topics[t] = true
				continue
			}
			delete(o.topics, t)
			for tp := range o.parts {
				if tp.Topic == t {
					delete(o.parts, tp)
				}
			}
		}
		for _, tp := range c.tps {
			if c.pause {
				o.parts[tp] = true
			} else {
				delete(o.parts, tp)
			}
		}
		for _, ps := range s.parts {
			if p := o.paused(ps.tp); p != ps.opPaused {
				ps.opPaused = p
				s.flowDirty = append(s.flowDirty, ps)
				what := "resumed"
				if p {
					what = "paused"
				}
				s.log.Info("partition "+what+" by the operator", "partition", ps.tp.String())
			}
		}
	}
	o.seq++
	c.view, c.seq = o.view(), o.seq
	// The answer goes after the pause and resume calls: when the call
	// returns, the source was told.
	s.flushFlow()
	s.acts.answer = reply{to: req.reply, rep: sinkReply{err: err}}
}

// view returns the pauses, sorted; a partition of a topic paused as a
// whole is left out.
func (o *opState) view() OperatorPauses {
	var v OperatorPauses
	for t := range o.topics {
		v.Topics = append(v.Topics, t)
	}
	for tp := range o.parts {
		if !o.topics[tp.Topic] {
			v.Partitions = append(v.Partitions, tp)
		}
	}
	slices.Sort(v.Topics)
	slices.SortFunc(v.Partitions, func(a, b TP) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return v
}
