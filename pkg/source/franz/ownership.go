package franz

import (
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
)

// ownership is which partitions the group gave this member and neither
// revoked nor lost since, each with the member id it was assigned under;
// the commits whose ownership check passed and that are not answered yet
// (sent); and the floors of rejoined partitions. The group callbacks
// change it, Commit and the commit request's ownership check (admit) read
// it, and Run's goroutine counts it (holdCap).
//
// mu guards every field. Each method takes mu and releases it before it
// returns; none holds it across I/O (a broker round trip, a log line), a
// call into the runner, or a call into the client: the poll path takes it
// too (holdCap), and a commit's answer (settle) must be able to take it
// while a revoke or loss waits for that answer (disown). disown waits for
// the answers without mu.
//
// In the classic protocol the broker does not check that a committing
// member owns the partition, only that its member id and generation are
// current. When the session is lost, franz-go calls OnPartitionsLost and
// then rejoins with a new generation; a commit that was still waiting (for
// the coordinator, or for the join to finish) would go out under the new
// generation for a partition that now belongs to another member and rewind
// that member's progress. So the ownership check of a commit runs when
// franz-go issues the request (admit, through kgo.PreCommitFnContext),
// against the member id the request carries: it drops the partitions not
// owned under it and registers the rest in sent. onLost removes the
// partitions from owned first (disown), then waits, without the lock, for
// every sent commit that names one of them to be answered, and only then
// tells the runner. A commit admitted before carries the member id and
// generation under which we still owned the partitions (the broker rejects
// it, or, if they are still current, accepts it for a partition nobody
// else can own in that generation); every later one finds them not owned
// and drops them. That makes invariant 4 (after Lost, nothing is committed
// for the partition) hold at the broker, not only in the runner's table:
// once onLost returns no commit for the partitions can go out, not even
// one that was already waiting. The wait lasts at most one commit round
// trip, bounded by the commit's ctx.
//
// owned maps each partition to the member id it was assigned under. When
// a commit is refused because the member was removed from the group
// (UNKNOWN_MEMBER_ID), franz-go rejoins under a new member id and then
// reports the partitions it no longer has as revoked, not lost; by then
// its commits carry the new member id and generation, which the
// coordinator accepts. Comparing the member ids tells the two apart:
// partitions assigned under an earlier member id are lost, and no commit
// for them may go out under the new one (see admit).
type ownership struct {
	mu     sync.Mutex
	owned  map[runner.TP]string
	sent   map[*sentCommit]struct{}
	floors map[runner.TP]*floor // rejoined partitions whose committed offset rejoin could not read
}

func newOwnership() *ownership {
	return &ownership{
		owned:  map[runner.TP]string{},
		sent:   map[*sentCommit]struct{}{},
		floors: map[runner.TP]*floor{},
	}
}

// sentCommit is a commit request that passed the ownership check (admit)
// and has not been answered yet. done is closed once it was.
type sentCommit struct {
	tps  []runner.TP
	done chan struct{}
}

// floor is the group's committed offset at the start of a rejoined
// partition's assignment, which rejoin could not read (the partition then
// starts from the client's own position, and another member may have
// committed past it meanwhile). Commit reads it before it sends anything
// for the partition and never sends an offset below it, so the member's
// commits cannot move the group's offset back; records between the two are
// handled again. Its fields are guarded by ownership.mu: only ownership's
// methods touch them, also through the pointers forCommit hands out.
type floor struct {
	at     int64 // valid once read
	read   bool
	logged bool // the first offset below it was logged
}

// assign records tps as owned under member, without floors (franz-go
// fetches their committed offsets itself), and returns, sorted, the
// partitions still owned under another member id that are not among tps:
// franz-go kept them across a member id change (see Source.onAssigned).
func (o *ownership) assign(member string, tps []runner.TP) (rejoined []runner.TP) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for tp, m := range o.owned {
		if m != member && !slices.Contains(tps, tp) {
			rejoined = append(rejoined, tp)
		}
	}
	for _, tp := range tps {
		o.owned[tp] = member
		delete(o.floors, tp)
	}
	sortTPs(rejoined)
	return rejoined
}

// rejoin owns tps again under member; those of unread get a floor, read
// before their first commit (see floor).
func (o *ownership) rejoin(member string, tps, unread []runner.TP) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tp := range tps {
		o.owned[tp] = member
	}
	for _, tp := range unread {
		o.floors[tp] = &floor{}
	}
}

// assignedBefore splits tps, which franz-go revokes while the member's id
// is member, into those owned under an earlier member id (lost when the
// member was removed from the group) and the rest, in their order.
func (o *ownership) assignedBefore(member string, tps []runner.TP) (rest, earlier []runner.TP) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tp := range tps {
		if m, ok := o.owned[tp]; ok && m != member {
			earlier = append(earlier, tp)
		} else {
			rest = append(rest, tp)
		}
	}
	return rest, earlier
}

// count is how many partitions are owned.
func (o *ownership) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.owned)
}

// disown gives up tps, revoked or lost: no commit for them is admitted
// from now on, and it returns once every commit admitted before that named
// one of them was answered (settle).
func (o *ownership) disown(tps []runner.TP) {
	var wait []chan struct{}
	o.mu.Lock()
	for _, tp := range tps {
		delete(o.owned, tp)
		delete(o.floors, tp)
	}
	if len(o.sent) > 0 {
		gone := make(map[runner.TP]bool, len(tps))
		for _, tp := range tps {
			gone[tp] = true
		}
		for c := range o.sent {
			if slices.ContainsFunc(c.tps, func(tp runner.TP) bool { return gone[tp] }) {
				wait = append(wait, c.done)
			}
		}
	}
	o.mu.Unlock()
	for _, done := range wait {
		<-done
	}
}

// forCommit splits offsets into those of partitions owned under member
// (owned, in their order) and the partitions of the others (notOwned), and
// returns the floors of the owned ones that have one. It is Commit's first
// sort; the check that counts is admit's.
func (o *ownership) forCommit(member string, offsets []runner.Offset) (owned []runner.Offset, notOwned []runner.TP, floors map[runner.TP]*floor) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, off := range offsets {
		if m, ok := o.owned[off.TP]; !ok || m != member {
			notOwned = append(notOwned, off.TP)
			continue
		}
		if f := o.floors[off.TP]; f != nil {
			if floors == nil {
				floors = make(map[runner.TP]*floor)
			}
			floors[off.TP] = f
		}
		owned = append(owned, off)
	}
	return owned, notOwned, floors
}

// floorsUnread reports whether any of floors was not read yet.
func (o *ownership) floorsUnread(floors map[runner.TP]*floor) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range floors {
		if !f.read {
			return true
		}
	}
	return false
}

// floorRead is the group's committed offset of a partition, read for its
// floor, or the error that read met.
type floorRead struct {
	at  int64
	err error
}

// floorVerdict is what applyFloors decided for one offset of a floored
// partition.
type floorVerdict struct {
	tp       runner.TP
	offset   int64
	floor    int64 // valid when err is nil
	err      error // the floor is still unread: the read failed with err
	logNow   bool  // the first offset below the floor: log it
	withhold bool  // not sent: below the floor, or the floor is unread
}

// applyFloors records the reads of the floors not read yet (reads has one
// for each of them when any was unread, see floorsUnread) and judges each
// of offsets, those of floored partitions: an offset at or above its read
// floor is sent; one below it, or whose floor could not be read, is
// withheld. It returns a verdict for each offset, in their order.
func (o *ownership) applyFloors(floors map[runner.TP]*floor, offsets []runner.Offset, reads map[runner.TP]floorRead) []floorVerdict {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]floorVerdict, 0, len(offsets))
	for _, off := range offsets {
		f := floors[off.TP]
		v := floorVerdict{tp: off.TP, offset: off.Offset}
		if !f.read {
			if r := reads[off.TP]; r.err != nil {
				v.err = r.err
			} else {
				f.at, f.read = r.at, true
			}
		}
		v.floor = f.at
		if !f.read || off.Offset < f.at {
			v.withhold = true
			if f.read && !f.logged {
				f.logged, v.logNow = true, true
			}
		}
		out = append(out, v)
	}
	return out
}

// admit is the ownership check of a commit request, run by franz-go just
// before it issues the request, with the member id and generation it
// carries. It removes from req the partitions not owned under that member
// id, and returns them. If any partition is left, it registers the request
// as sent: disown waits for its answer (settle) before the partitions it
// names count as given up. It returns a nil *sentCommit when nothing is
// left to send.
func (o *ownership) admit(req *kmsg.OffsetCommitRequest) (*sentCommit, []runner.TP) {
	var refused, kept []runner.TP
	o.mu.Lock()
	defer o.mu.Unlock()
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		ps := t.Partitions[:0]
		for _, p := range t.Partitions {
			tp := runner.TP{Topic: t.Topic, Partition: p.Partition}
			if m, ok := o.owned[tp]; !ok || m != req.MemberID {
				refused = append(refused, tp)
				continue
			}
			kept = append(kept, tp)
			ps = append(ps, p)
		}
		if t.Partitions = ps; len(ps) > 0 {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	if len(kept) == 0 {
		return nil, refused
	}
	sent := &sentCommit{tps: kept, done: make(chan struct{})}
	o.sent[sent] = struct{}{}
	return sent, refused
}

// settle marks a commit admit let through as answered (or abandoned: its
// ctx ended).
func (o *ownership) settle(sent *sentCommit) {
	o.mu.Lock()
	delete(o.sent, sent)
	o.mu.Unlock()
	close(sent.done)
}
