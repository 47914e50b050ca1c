package franz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
)

// CommitError reports a commit that was not acknowledged for every
// partition. The offsets of partitions not listed were acknowledged.
type CommitError struct {
	// Failed maps each partition whose commit failed, or whose outcome is
	// unknown, to the error: the broker's (a kerr.Error, e.g.
	// kerr.IllegalGeneration after a rebalance) or the request's.
	Failed map[runner.TP]error
	// NotOwned lists the partitions left out because this member does not
	// own them (revoked or lost before the commit).
	NotOwned []runner.TP
}

func (e *CommitError) Error() string {
	var b strings.Builder
	b.WriteString("franz: commit")
	if len(e.Failed) > 0 {
		tps := make([]runner.TP, 0, len(e.Failed))
		for tp := range e.Failed {
			tps = append(tps, tp)
		}
		sortTPs(tps)
		b.WriteString(" failed for")
		for i, tp := range tps {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(" " + tp.String() + " (" + e.Failed[tp].Error() + ")")
		}
	}
	if len(e.NotOwned) > 0 {
		if len(e.Failed) > 0 {
			b.WriteByte(';')
		}
		b.WriteString(" not sent for partitions not owned:")
		for i, tp := range e.NotOwned {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(" " + tp.String())
		}
	}
	return b.String()
}

// Unwrap returns the distinct errors of Failed, and ErrNotOwned when
// NotOwned is not empty, for errors.Is and errors.As.
func (e *CommitError) Unwrap() []error {
	var errs []error
	for _, err := range e.Failed {
		if !slices.Contains(errs, err) {
			errs = append(errs, err)
		}
	}
	if len(e.NotOwned) > 0 {
		errs = append(errs, ErrNotOwned)
	}
	return errs
}

var errNoAnswer = errors.New("franz: the broker's answer did not include the partition")

// Commit commits offsets (the next offset to consume per partition)
// synchronously with the group's current member id and generation, and
// returns when the broker answered or ctx is done. Offsets of partitions
// this member does not own are not sent. It returns nil when every offset
// was acknowledged, and a *CommitError naming the partitions otherwise.
// The runner calls it from one goroutine; calls never overlap.
func (s *Source) Commit(ctx context.Context, offsets []runner.Offset) error {
	// Held until the broker answered: see ownMu.
	s.ownMu.Lock()
	defer s.ownMu.Unlock()

	var notOwned []runner.TP
	send := make(map[string]map[int32]kgo.EpochOffset)
	member, _ := s.cl.GroupMetadata()
	for _, o := range offsets {
		if m, ok := s.owned[o.TP]; !ok || m != member {
			notOwned = append(notOwned, o.TP)
			continue
		}
		ps := send[o.TP.Topic]
		if ps == nil {
			ps = make(map[int32]kgo.EpochOffset)
			send[o.TP.Topic] = ps
		}
		// Epoch -1: tidemark's offsets are not tied to one record's
		// leader epoch (a position past control records has none), so
		// the next owner skips truncation detection for this commit.
		ps[o.TP.Partition] = kgo.EpochOffset{Epoch: -1, Offset: o.Offset}
	}
	if len(notOwned) > 0 {
		sortTPs(notOwned)
		s.log.Warn("not committing offsets for partitions this member does not own", "partitions", tpStrings(notOwned))
	}
	var failed map[runner.TP]error
	if len(send) > 0 {
		// franz-go holds a commit while the group rejoins and sends it
		// with the member id and generation current then: refuse to send
		// it if the member id is no longer the one the partitions were
		// assigned under.
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			if req.MemberID != member {
				return fmt.Errorf("%w: the member rejoined as %s (was %s)", ErrNotOwned, req.MemberID, member)
			}
			return nil
		})
		failed = s.commit(ctx, send)
	}
	if len(failed) > 0 || len(notOwned) > 0 {
		return &CommitError{Failed: failed, NotOwned: notOwned}
	}
	return nil
}

// commit sends one OffsetCommit and returns the partitions that were not
// acknowledged.
func (s *Source) commit(ctx context.Context, send map[string]map[int32]kgo.EpochOffset) map[runner.TP]error {
	failed := make(map[runner.TP]error)
	failAll := func(err error) {
		for t, ps := range send {
			for p := range ps {
				failed[runner.TP{Topic: t, Partition: p}] = err
			}
		}
	}
	s.cl.CommitOffsetsSync(ctx, send, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			failAll(err)
			return
		}
		// From OffsetCommit v10 the response names topics by id only.
		names := make(map[[16]byte]string, len(req.Topics))
		for _, t := range req.Topics {
			names[t.TopicID] = t.Topic
		}
		acked := make(map[runner.TP]bool)
		for _, t := range resp.Topics {
			topic := t.Topic
			if topic == "" {
				topic = names[t.TopicID]
			}
			for _, p := range t.Partitions {
				tp := runner.TP{Topic: topic, Partition: p.Partition}
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					failed[tp] = perr
					continue
				}
				acked[tp] = true
			}
		}
		for t, ps := range send {
			for p := range ps {
				tp := runner.TP{Topic: t, Partition: p}
				if _, bad := failed[tp]; !bad && !acked[tp] {
					failed[tp] = errNoAnswer
				}
			}
		}
	})
	return failed
}
