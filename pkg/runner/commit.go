package runner

import (
	"context"
	"time"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

type commitReq struct {
	commits  []rebalance.Commit
	offsets  []Offset
	deadline time.Time
	drains   []*drain // finished by this commit
	err      error
	took     time.Duration
}

func (s *pollState) newCommit(deadline time.Time) *commitReq {
	s.pendingBuf = s.table.Pending(s.pendingBuf[:0])
	c := &commitReq{deadline: deadline}
	if len(s.pendingBuf) > 0 {
		c.commits = append([]rebalance.Commit(nil), s.pendingBuf...)
		c.offsets = make([]Offset, len(c.commits))
		for i, pc := range c.commits {
			c.offsets[i] = Offset{TP: pc.TP, Offset: pc.Offset}
		}
	}
	return c
}

// send puts c in the actions, for the committer, and marks it in flight.
func (s *pollState) send(c *commitReq) {
	s.committing = c
	s.acts.commit = c
}

// tick runs every commit interval, after the refresh of the stats the
// probes and gauges read (publishStats): the memory's trimming and an
// asynchronous commit of the safe offsets.
func (s *pollState) tick() {
	s.trimMemory()
	if s.committing != nil || s.stopping {
		return
	}
	c := s.newCommit(time.Time{})
	if len(c.offsets) > 0 {
		s.send(c)
	}
}

func (s *pollState) onCommitted(c *commitReq) {
	s.committing = nil
	for _, ch := range s.afterCommit {
		s.acts.replies = append(s.acts.replies, reply{to: ch})
	}
	s.afterCommit = s.afterCommit[:0]
	s.tel.committed(c.took, c.commits, c.err, s.parts)
	if c.err != nil {
		if len(c.drains) > 0 {
			s.log.Error("final commit failed; the records after the last acknowledged offsets will be delivered again", "err", c.err, "partitions", len(c.commits))
		} else {
			s.log.Warn("commit failed; the next commit sends the newest safe offsets", "err", c.err, "partitions", len(c.commits))
		}
		for _, pc := range c.commits {
			s.table.CommitFailed(pc)
		}
	} else {
		for _, pc := range c.commits {
			s.table.Committed(pc)
		}
	}
	if len(c.drains) > 0 {
		var err error
		if c.err != nil {
			err = &FinalCommitError{Err: c.err}
		}
		s.finishDrains(c.drains, err)
	}
	s.finalCommit()
}

// committer is the one goroutine that calls Source.Commit, one request at a
// time, so commits are sequenced and the poll loop never blocks on the
// broker.
func (r *Runner) committer(ctx context.Context) {
	for c := range r.commitReq {
		// CommitTimeout bounds every request; a final commit of a
		// shutdown also ends with Shutdown's ctx (c.deadline).
		by := time.Now().Add(r.cfg.commitTimeout)
		if !c.deadline.IsZero() && c.deadline.Before(by) {
			by = c.deadline
		}
		cctx, cancel := context.WithDeadline(ctx, by)
		start := time.Now()
		c.err = r.src.Commit(cctx, c.offsets)
		c.took = time.Since(start)
		cancel()
		select {
		case r.commitRes <- c:
		case <-r.loopDone:
		}
	}
}
