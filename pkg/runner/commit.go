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

func (r *Runner) newCommit(deadline time.Time) *commitReq {
	r.pendingBuf = r.table.Pending(r.pendingBuf[:0])
	c := &commitReq{deadline: deadline}
	if len(r.pendingBuf) > 0 {
		c.commits = append([]rebalance.Commit(nil), r.pendingBuf...)
		c.offsets = make([]Offset, len(c.commits))
		for i, pc := range c.commits {
			c.offsets[i] = Offset{TP: pc.TP, Offset: pc.Offset}
		}
	}
	return c
}

// send puts c in the actions, for the committer, and marks it in flight.
func (r *Runner) send(c *commitReq) {
	r.committing = c
	r.acts.commit = c
}

// tick runs every commit interval, after the refresh of the stats the
// probes and gauges read (publishStats): the memory's trimming and an
// asynchronous commit of the safe offsets.
func (r *Runner) tick() {
	r.trimMemory()
	if r.committing != nil || r.stopping {
		return
	}
	c := r.newCommit(time.Time{})
	if len(c.offsets) > 0 {
		r.send(c)
	}
}

func (r *Runner) onCommitted(c *commitReq) {
	r.committing = nil
	for _, ch := range r.afterCommit {
		r.acts.replies = append(r.acts.replies, reply{to: ch})
	}
	r.afterCommit = r.afterCommit[:0]
	r.tel.commitLatency.Record(context.Background(), c.took.Seconds())
	if c.err != nil {
		r.tel.commitFailures.Add(context.Background(), 1)
		if len(c.drains) > 0 {
			r.log.Error("final commit failed; the records after the last acknowledged offsets will be delivered again", "err", c.err, "partitions", len(c.commits))
		} else {
			r.log.Warn("commit failed; the next commit sends the newest safe offsets", "err", c.err, "partitions", len(c.commits))
		}
		for _, pc := range c.commits {
			r.table.CommitFailed(pc)
		}
	} else {
		for _, pc := range c.commits {
			r.table.Committed(pc)
		}
	}
	if len(c.drains) > 0 {
		var err error
		if c.err != nil {
			err = &FinalCommitError{Err: c.err}
		}
		r.finishDrains(c.drains, err)
	}
	r.finalCommit()
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
