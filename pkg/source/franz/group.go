package franz

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/watermark"
)

// sinkOf returns the sink and Run's ctx, or nil before Run.
func (s *Source) sinkOf() (runner.Sink, context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sink, s.runCtx
}

// onAssigned reports newly assigned partitions. franz-go calls it before it
// fetches their committed offsets, so the start is unknown: the runner takes
// it from the first delivery.
func (s *Source) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	tps := tpsOf(assigned)
	// franz-go calls this at the start of every group session, after the
	// revokes. Partitions still owned were kept by this session's
	// assignment. Those kept under the current member id continue as they
	// are. Those assigned under an earlier member id (see ownership) were not
	// ours in between: the coordinator removed this member (its session
	// expired, e.g. while the process was stopped) and it rejoined under a
	// new id, but franz-go keeps the partitions as if nothing happened. In
	// between another member may have owned them, handled their records,
	// committed past them and taken their inbox leases. They are lost and
	// assigned anew (rejoined).
	member, gen := s.cl.GroupMetadata()
	rejoined := s.own.assign(member, tps)
	starts := map[runner.TP]int64{}
	if len(rejoined) > 0 {
		starts = s.rejoin(rejoined, member)
		tps = append(tps, rejoined...)
	}
	if len(tps) == 0 {
		// Nothing new, or nothing at all (more members than partitions):
		// the runner still hears that the member joined.
		s.reportAssigned(nil)
		return
	}
	// The runner starts a new assignment unpaused; drop a pause franz-go
	// (or this source) may still hold from an earlier assignment of the
	// same partition, and records held from it (none should be: the
	// revoke or loss dropped them).
	s.hold.drop(tps)
	s.flow.assigned(tps)
	s.log.Info("partitions assigned", "partitions", tpStrings(tps))
	// The generation orders this assignment against other members' (an
	// assign hook refuses one older than the partition's lease). In the
	// classic protocol it is the group's generation, which cannot change
	// until this callback returns. Under KIP-848 GroupMetadata returns the
	// member epoch instead, which franz-go's heartbeat goroutine stores
	// from every response (keepalives included) concurrently with this
	// callback, and which a rejoining member restarts at 0: the value read
	// here is not the epoch the partition was assigned in, and nothing
	// promises it orders this member's assignment against the next
	// owner's. So pass none (the hook then takes the lease
	// unconditionally, as before), rather than a number that may look
	// newer than it is.
	if s.cfg.serverSide {
		gen = runner.NoGeneration
	}
	as := make([]runner.Assignment, len(tps))
	for i, tp := range tps {
		start, ok := starts[tp]
		if !ok {
			start = watermark.Unknown
		}
		as[i] = runner.Assignment{TP: tp, Start: start, Generation: gen, Member: member}
	}
	s.reportAssigned(as)
}

// reportAssigned reports an assignment, possibly empty, to the runner.
func (s *Source) reportAssigned(as []runner.Assignment) {
	sink, ctx := s.sinkOf()
	if sink == nil {
		return
	}
	if err := sink.Assigned(ctx, as); !benign(ctx, err) {
		s.log.Warn("runner did not take the assignment", "partitions", len(as), "err", err)
		return
	}
	s.joined.reported.Store(true)
}

// rejoin handles partitions franz-go kept across a member id change: it
// reports them lost (the runner ends their assignment and commits nothing
// more for it), moves the client's fetch position back to the group's
// committed offsets (another member may have committed past where this one
// stopped; continuing from its own position would commit behind them), and
// owns them again under member. It returns the committed offsets it found,
// the start of the new assignments. A partition whose committed offset it
// could not read starts where the client goes on fetching, with a floor
// (see Commit): the group's offset, read before anything is committed for
// it, below which nothing is sent.
func (s *Source) rejoin(tps []runner.TP, member string) map[runner.TP]int64 {
	s.log.Warn("partitions kept across a rejoin under a new member id; they were lost in between and are assigned anew",
		"partitions", tpStrings(tps), "member", member)
	s.onLost(context.Background(), s.cl, mapOf(tps))
	starts := map[runner.TP]int64{}
	_, runCtx := s.sinkOf()
	if runCtx == nil {
		runCtx = context.Background()
	}
	ctx, cancel := context.WithTimeout(runCtx, s.cfg.sessionTimeout)
	defer cancel()
	// Read again for up to rejoinReadFor when it fails: a partition whose
	// offset stays unread starts at the client's position, past the
	// records the lost assignment fetched and did not finish, which then
	// no one runs (the floor keeps commits from going backward, not
	// forward past them).
	retryUntil := time.Now().Add(rejoinReadFor)
	resp, err := kadm.NewClient(s.cl).FetchOffsets(ctx, s.group)
	for wait := 50 * time.Millisecond; err != nil && ctx.Err() == nil && time.Now().Add(wait).Before(retryUntil); wait = min(2*wait, time.Second) {
		s.log.Warn("reading the committed offsets of rejoined partitions failed; trying again", "partitions", tpStrings(tps), "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		resp, err = kadm.NewClient(s.cl).FetchOffsets(ctx, s.group)
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	var unread []runner.TP
	for _, tp := range tps {
		if err != nil {
			unread = append(unread, tp)
			continue
		}
		o, ok := resp.Lookup(tp.Topic, tp.Partition)
		switch {
		case !ok || o.Err != nil:
			unread = append(unread, tp)
			continue
		case o.At < 0:
			continue // nothing committed: nothing to go behind
		}
		if set[tp.Topic] == nil {
			set[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		set[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: o.At}
		starts[tp] = o.At
	}
	if len(unread) > 0 {
		s.log.Warn("could not read the committed offsets of rejoined partitions; fetching goes on from the client's position, and nothing is committed for them below the group's offset, read again before their first commit",
			"partitions", tpStrings(unread), "err", err)
	}
	if len(set) > 0 {
		// Safe here: franz-go runs this callback while no poll holds
		// records (BlockRebalanceOnPoll) and no revoke can run.
		s.cl.SetOffsets(set)
	}
	s.own.rejoin(member, tps, unread)
	return starts
}

// rejoinReadFor is how long rejoin tries to read the committed offsets of
// rejoined partitions: long enough for a coordinator to move, short of
// holding the assign callback (and with it the poll) for long.
const rejoinReadFor = 5 * time.Second

// onRevoked hands revoked partitions to the runner, which drains them and
// commits their final offsets through Commit before it returns; franz-go
// keeps heartbeating meanwhile and holds the rebalance. franz-go also calls
// it with nothing at the end of every group session.
func (s *Source) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	tps := tpsOf(revoked)
	if len(tps) == 0 {
		return
	}
	// Partitions assigned under an earlier member id were lost when the
	// member was removed; franz-go reports them here after rejoining.
	member, _ := s.cl.GroupMetadata()
	tps, lost := s.own.assignedBefore(member, tps)
	if len(lost) > 0 {
		s.onLost(context.Background(), s.cl, mapOf(lost))
	}
	if len(tps) == 0 {
		return
	}
	// Records held for them never reach the runner: it would drop them
	// anyway while draining, and after the drain they would belong to an
	// ended assignment.
	s.hold.drop(tps)
	s.log.Info("partitions revoked; draining", "partitions", tpStrings(tps))
	if sink, ctx := s.sinkOf(); sink != nil {
		// Half the rebalance timeout leaves the other half for the final
		// commit and the rejoin; the runner also applies its DrainBudget.
		deadline := time.Now().Add(s.cfg.rebalanceTimeout / 2)
		if err := sink.Revoked(ctx, tps, deadline); !benign(ctx, err) {
			s.log.Warn("revoke drain ended with an error", "partitions", tpStrings(tps), "err", err)
		}
	}
	s.own.disown(tps)
}

// onLost drops partitions whose ownership is gone (the session expired or
// was fenced): ownership first (ownership.disown), so nothing more is
// committed for them, not even a commit already on its way; then the
// runner, which cancels their handlers.
func (s *Source) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	tps := tpsOf(lost)
	wasJoined := s.joined.reported.Swap(false)
	if len(tps) == 0 {
		// The member lost its membership holding nothing: the runner
		// learns it is no longer joined. franz-go also calls this after
		// every failed join attempt; those it need not hear again.
		if sink, ctx := s.sinkOf(); sink != nil && wasJoined {
			if err := sink.Lost(ctx, nil); !benign(ctx, err) {
				s.log.Warn("runner did not take the loss", "err", err)
			}
		}
		return
	}
	s.own.disown(tps)
	s.hold.drop(tps)
	s.log.Warn("partitions lost; nothing more is committed for them", "partitions", tpStrings(tps))
	if sink, ctx := s.sinkOf(); sink != nil {
		if err := sink.Lost(ctx, tps); !benign(ctx, err) {
			s.log.Warn("runner did not take the loss", "partitions", tpStrings(tps), "err", err)
		}
	}
}

// benign reports whether a Sink call's err is nil or says the runner (or
// Run's ctx) has stopped, which the callbacks expect during Close.
func benign(ctx context.Context, err error) bool {
	return err == nil || errors.Is(err, runner.ErrStopped) || ctx.Err() != nil
}

func tpsOf(m map[string][]int32) []runner.TP {
	var tps []runner.TP
	for t, ps := range m {
		for _, p := range ps {
			tps = append(tps, runner.TP{Topic: t, Partition: p})
		}
	}
	sortTPs(tps)
	return tps
}

func mapOf(tps []runner.TP) map[string][]int32 {
	m := make(map[string][]int32)
	for _, tp := range tps {
		m[tp.Topic] = append(m[tp.Topic], tp.Partition)
	}
	return m
}
