package franz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
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
// this member does not own are not sent. An offset below a rejoined
// partition's floor (see rejoin) is not sent either and counts as
// acknowledged: the group's offset is already past it. It returns nil when
// every offset was acknowledged, and a *CommitError naming the partitions
// otherwise. The runner calls it from one goroutine; calls never overlap.
func (s *Source) Commit(ctx context.Context, offsets []runner.Offset) error {
	member, _ := s.cl.GroupMetadata()
	owned, notOwned, floors := s.own.forCommit(member, offsets)
	failed := make(map[runner.TP]error)
	if len(floors) > 0 {
		owned = s.applyFloors(ctx, floors, owned, failed)
	}
	if len(owned) > 0 {
		// The check above is a first sort; the one that counts is
		// admit's, made when franz-go issues the request, with the member
		// id it carries (franz-go holds a commit while the group rejoins
		// and sends it with the member id and generation current then).
		var sent *sentCommit
		var refused []runner.TP
		ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
			sent, refused = s.own.admit(req)
			if sent == nil {
				return errAllRefused
			}
			return nil
		})
		s.commit(ctx, commitMap(owned), failed, func() {
			if sent != nil {
				s.own.settle(sent)
			}
		})
		for _, tp := range refused {
			delete(failed, tp)
		}
		notOwned = append(notOwned, refused...)
	}
	if len(notOwned) > 0 {
		sortTPs(notOwned)
		s.log.Warn("not committing offsets for partitions this member does not own", "partitions", tpStrings(notOwned))
	}
	if len(failed) > 0 || len(notOwned) > 0 {
		return &CommitError{Failed: failed, NotOwned: notOwned}
	}
	return nil
}

// commitMap is offsets as franz-go commits them.
func commitMap(offsets []runner.Offset) map[string]map[int32]kgo.EpochOffset {
	send := make(map[string]map[int32]kgo.EpochOffset)
	for _, o := range offsets {
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
	return send
}

// applyFloors reads the floors not read yet and returns owned without the
// offsets below their partition's floor and those whose floor could not be
// read (into failed: the runner sends them again with its next commit).
// The read is a broker round trip, made without ownership's lock.
func (s *Source) applyFloors(ctx context.Context, floors map[runner.TP]*floor, owned []runner.Offset, failed map[runner.TP]error) []runner.Offset {
	var reads map[runner.TP]floorRead
	if s.own.floorsUnread(floors) {
		// Nothing was committed for these partitions since their
		// assignment began (an unread floor holds back every commit), and
		// no other member can commit while this one owns them: what the
		// group holds now is what it held then.
		resp, err := kadm.NewClient(s.cl).FetchOffsets(ctx, s.group)
		reads = make(map[runner.TP]floorRead, len(floors))
		for tp := range floors {
			o, ok := resp.Lookup(tp.Topic, tp.Partition)
			switch {
			case err != nil:
				reads[tp] = floorRead{err: fmt.Errorf("franz: reading the group's committed offset of rejoined %s before its first commit: %w", tp, err)}
			case ok && o.Err != nil:
				reads[tp] = floorRead{err: fmt.Errorf("franz: reading the group's committed offset of rejoined %s before its first commit: %w", tp, o.Err)}
			default:
				reads[tp] = floorRead{at: o.At} // -1 when nothing is committed (or !ok)
			}
		}
	}
	var floored []runner.Offset
	for _, o := range owned {
		if floors[o.TP] != nil {
			floored = append(floored, o)
		}
	}
	withheld := map[runner.TP]bool{}
	for _, v := range s.own.applyFloors(floors, floored, reads) {
		if !v.withhold {
			continue
		}
		withheld[v.tp] = true
		if v.err != nil {
			failed[v.tp] = v.err
		}
		if v.logNow {
			s.log.Info("not committing a rejoined partition behind the group's offset, which another member moved while this one was out of the group; records up to it are handled again",
				"partition", v.tp.String(), "offset", v.offset, "group_offset", v.floor)
		}
	}
	return slices.DeleteFunc(owned, func(o runner.Offset) bool { return withheld[o.TP] })
}

// errAllRefused stops a commit whose partitions admit refused all.
var errAllRefused = fmt.Errorf("%w: no partition of the commit is owned", ErrNotOwned)

// commit sends one OffsetCommit and adds the partitions that were not
// acknowledged to failed. answered runs once the outcome is known (or
// abandoned), before the client lets another commit go out.
func (s *Source) commit(ctx context.Context, send map[string]map[int32]kgo.EpochOffset, failed map[runner.TP]error, answered func()) {
	failAll := func(err error) {
		for t, ps := range send {
			for p := range ps {
				failed[runner.TP{Topic: t, Partition: p}] = err
			}
		}
	}
	s.cl.CommitOffsetsSync(ctx, send, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		defer answered()
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
}
