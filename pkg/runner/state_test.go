package runner

// Unit tests of pollState, the poll goroutine's logic, driven the way
// pkg/rebalance's tests drive a Table: no goroutine, no Source (the one New
// gets fails the test if called), no sleep and no real clock. Each test
// feeds events and checks the actions they return — what the loop would
// tell the source, the workers and the committer. The package's other
// tests check the same behaviour through a running Runner.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

const stateTopic = "s"

func stp(p int32) TP { return TP{Topic: stateTopic, Partition: p} }

// noSource fails the test on every call: the poll state must reach the
// source only through the actions it returns.
type noSource struct{ t *testing.T }

func (s noSource) Run(context.Context, Sink) error {
	s.t.Error("pollState called Source.Run")
	return nil
}
func (s noSource) Pause([]TP)   { s.t.Error("pollState called Source.Pause") }
func (s noSource) Resume([]TP)  { s.t.Error("pollState called Source.Resume") }
func (s noSource) Close() error { s.t.Error("pollState called Source.Close"); return nil }
func (s noSource) Commit(context.Context, []Offset) error {
	s.t.Error("pollState called Source.Commit")
	return nil
}

// harness drives one pollState with a clock of its own.
type harness struct {
	t     *testing.T
	s     *pollState
	clock time.Time
}

func newHarness(t *testing.T, opts ...Option) *harness {
	t.Helper()
	base := []Option{
		Handle(stateTopic, func(context.Context, Record) error { return nil }),
		Logger(slog.New(slog.DiscardHandler)),
	}
	r, err := New(noSource{t}, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, s: &r.poll, clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.s.now = func() time.Time { return h.clock }
	return h
}

// got is a copy of the actions of one event followed by those of the
// settle the loop runs after it (the state reuses its actions once they
// were carried out: do resets them, as carryOut does).
type got struct {
	replies       []reply
	commit        *commitReq
	work          []*task
	pause, resume []TP // the event's, then settle's
	answer        reply
	drainAt       time.Time
}

func (h *harness) do(a *actions) got {
	h.t.Helper()
	g := got{
		replies: slices.Clone(a.replies), commit: a.commit, work: tasksOf(a.work),
		pause: slices.Clone(a.pause), resume: slices.Clone(a.resume), answer: a.answer, drainAt: a.drainAt,
	}
	a.reset()
	st := h.s.settle()
	if len(st.replies) > 0 || st.commit != nil || st.answer.to != nil || st.answer.toErr != nil || !st.drainAt.IsZero() {
		h.t.Fatalf("settle returned more than work and flow: %+v", st)
	}
	g.work = append(g.work, tasksOf(st.work)...)
	g.pause = append(g.pause, st.pause...)
	g.resume = append(g.resume, st.resume...)
	st.reset()
	if len(st.replies)+len(st.pause)+len(st.resume)+st.work.n > 0 || st.commit != nil ||
		st.answer != (reply{}) || !st.drainAt.IsZero() {
		h.t.Fatalf("reset left actions behind: %+v", *st)
	}
	return g
}

func tasksOf(w work) []*task {
	var ts []*task
	for t := w.head; len(ts) < w.n; t = t.nextQ {
		ts = append(ts, t)
	}
	return ts
}

// answered returns the reply of g sent on ch (a Sink call's reply
// channel), and whether there is one.
func (g got) answered(ch chan sinkReply) (sinkReply, bool) {
	for _, rp := range append(slices.Clone(g.replies), g.answer) {
		if rp.to == ch {
			return rp.rep, true
		}
	}
	return sinkReply{}, false
}

// revokeAnswered is answered for Revoked's channel.
func (g got) revokeAnswered(ch chan error) (error, bool) {
	for _, rp := range append(slices.Clone(g.replies), g.answer) {
		if rp.toErr == ch {
			return rp.rep.err, true
		}
	}
	return nil, false
}

func (h *harness) assign(start int64, tps ...TP) got {
	h.t.Helper()
	as := make([]Assignment, len(tps))
	for i, tp := range tps {
		as[i] = Assignment{TP: tp, Start: start, Generation: NoGeneration}
	}
	req := &sinkReq{kind: sinkAssigned, assigns: as, reply: make(chan sinkReply, 1)}
	g := h.do(h.s.reported(req))
	if _, ok := g.answered(req.reply); !ok {
		h.t.Fatalf("Assigned %v not answered: %+v", tps, g)
	}
	return g
}

// fetch hands over one batch of tp's records at offsets, each with a value
// of size bytes, and checks it is answered.
func (h *harness) fetch(tp TP, size int, offsets ...int64) got {
	h.t.Helper()
	b := Batch{TP: tp, Position: -1, HighWatermark: -1}
	for _, off := range offsets {
		b.Records = append(b.Records, Record{Topic: tp.Topic, Partition: tp.Partition, Offset: off, Value: make([]byte, size)})
	}
	req := &sinkReq{kind: sinkFetched, batches: []Batch{b}, reply: make(chan sinkReply, 1)}
	g := h.do(h.s.reported(req))
	if _, ok := g.answered(req.reply); !ok {
		h.t.Fatalf("Fetched not answered: %+v", g)
	}
	return g
}

func (h *harness) lost(tps ...TP) (got, chan sinkReply) {
	req := &sinkReq{kind: sinkLost, tps: tps, reply: make(chan sinkReply, 1)}
	return h.do(h.s.reported(req)), req.reply
}

func (h *harness) revoke(deadline time.Time, tps ...TP) (got, chan error) {
	req := &sinkReq{kind: sinkRevoked, tps: tps, deadline: deadline, replyErr: make(chan error, 1)}
	return h.do(h.s.reported(req)), req.replyErr
}

// finish hands back ts as a worker does after their handlers succeeded.
func (h *harness) finish(ts ...*task) got {
	var head, tail *task
	for _, t := range ts {
		t.res = resHandled
		t.nextQ = nil
		if head == nil {
			head = t
		} else {
			tail.nextQ = t
		}
		tail = t
	}
	return h.do(h.s.tasksFinished(head))
}

// answer answers the commit in flight c with err (nil: acknowledged).
func (h *harness) answer(c *commitReq, err error) got {
	c.err = err
	return h.do(h.s.committed(c))
}

func (h *harness) tick() got { return h.do(h.s.ticked()) }

// offsetsOf returns what c commits, or nil for no commit.
func offsetsOf(c *commitReq) []Offset {
	if c == nil {
		return nil
	}
	return c.offsets
}

func TestStatePausesAtTheHighWaterMarkAndResumesAtTheLow(t *testing.T) {
	h := newHarness(t, WaterMarks(10, 4))
	tp := stp(0)
	h.assign(0, tp)
	// The poll chunk is (10-4)/2 = 3: the partition pauses once its room
	// below the high mark is less than that, at 8 records.
	var ts []*task
	for off := range int64(8) {
		req := &sinkReq{kind: sinkFetched, reply: make(chan sinkReply, 1), batches: []Batch{{
			TP: tp, Position: -1, HighWatermark: -1, Records: []Record{{Topic: stateTopic, Offset: off}},
		}}}
		a := h.s.reported(req)
		// The pause is in the event's own actions, carried out before its
		// answer: the source's next poll must leave the partition out.
		paused := slices.Equal(a.pause, []TP{tp})
		if want := off == 7; paused != want {
			t.Fatalf("record %d: Fetched paused %v, want paused %v", off, a.pause, want)
		}
		if a.answer.to != req.reply {
			t.Fatalf("record %d: Fetched not answered after its pause", off)
		}
		g := h.do(a)
		if len(g.resume) > 0 {
			t.Fatalf("record %d: resumed %v", off, g.resume)
		}
		ts = append(ts, g.work...)
	}
	if len(ts) != 8 {
		t.Fatalf("%d tasks dispatched, want 8", len(ts))
	}
	// Finishing in order brings the count down; it resumes at the low mark,
	// 4 records, and not before.
	for i, tk := range ts[:4] {
		g := h.finish(tk)
		resumed := slices.Equal(g.resume, []TP{tp})
		if want := i == 3; resumed != want || len(g.pause) > 0 {
			t.Fatalf("after %d finished (%d left): resume %v, pause %v; want resumed %v", i+1, 7-i, g.resume, g.pause, want)
		}
	}
}

func TestStateGlobalCapPausesAllAndResumesAtHalf(t *testing.T) {
	h := newHarness(t, MaxBufferedBytes(4<<20), ByteWaterMarks(4<<20, 2<<20), WaterMarks(100, 50))
	all := []TP{stp(0), stp(1), stp(2)}
	h.assign(0, all...)
	pauseAt := h.s.pauseAt
	if pauseAt <= 0 {
		t.Fatalf("pauseAt %d", pauseAt)
	}
	// Records of 64 KiB into partitions 0 and 1 only, one at a time, until
	// the claim reaches pauseAt: that hand-over pauses all three, the empty
	// partition 2 too, and none before it.
	var ts []*task
	next := [2]int64{}
	for i := 0; ; i++ {
		p := i % 2
		before := h.s.claimed()
		g := h.fetch(stp(int32(p)), 64<<10, next[p])
		next[p]++
		ts = append(ts, g.work...)
		if before >= pauseAt {
			t.Fatalf("claim %d reached pauseAt %d with nothing paused", before, pauseAt)
		}
		if len(g.pause) == 0 {
			continue
		}
		if c := h.s.claimed(); c < pauseAt {
			t.Fatalf("paused %v at claim %d, below pauseAt %d", g.pause, c, pauseAt)
		}
		if !sameTPs(g.pause, all) {
			t.Fatalf("the global cap paused %v, want all of %v", g.pause, all)
		}
		break
	}
	// Finishing brings the claim down: every partition resumes at the
	// first completion that takes it to half of pauseAt, not before.
	for i, tk := range ts {
		g := h.finish(tk)
		c := h.s.claimed()
		if len(g.resume) == 0 {
			if c <= pauseAt/2 {
				t.Fatalf("claim %d at half of pauseAt %d and nothing resumed", c, pauseAt)
			}
			continue
		}
		if c > pauseAt/2 {
			t.Fatalf("resumed %v at claim %d, above half of pauseAt %d", g.resume, c, pauseAt)
		}
		if !sameTPs(g.resume, all) {
			t.Fatalf("resumed %v, want all of %v", g.resume, all)
		}
		if i == len(ts)-1 {
			t.Fatal("resumed only once every record finished")
		}
		return
	}
	t.Fatal("never resumed")
}

func sameTPs(a, b []TP) bool {
	cmp := func(x, y TP) int { return strings.Compare(x.String(), y.String()) }
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	return slices.Equal(a, b)
}

func TestStateCommitsTheContiguousCompletedPrefix(t *testing.T) {
	h := newHarness(t)
	tp := stp(0)
	h.assign(100, tp)
	g := h.fetch(tp, 1, 100, 103, 108) // sparse: 101, 102 and 104..107 are not records
	if len(g.work) != 3 {
		t.Fatalf("%d tasks dispatched, want 3", len(g.work))
	}
	t100, t103, t108 := g.work[0], g.work[1], g.work[2]
	if c := h.tick().commit; c != nil {
		t.Fatalf("nothing finished, tick committed %v", c.offsets)
	}
	// 108 finished first: it is not behind an unfinished record yet.
	h.finish(t108)
	if c := h.tick().commit; c != nil {
		t.Fatalf("only 108 finished, tick committed %v", c.offsets)
	}
	// 100 finished: the prefix is 100 alone, so the commit is 101 (the
	// next fetch finds 103), never past 103, which has not finished.
	h.finish(t100)
	c := h.tick().commit
	if want := []Offset{{TP: tp, Offset: 101}}; !slices.Equal(offsetsOf(c), want) {
		t.Fatalf("tick committed %v, want %v", offsetsOf(c), want)
	}
	h.finish(t103)
	if g := h.tick(); g.commit != nil {
		t.Fatalf("a second commit while one is in flight: %v", g.commit.offsets)
	}
	h.answer(c, nil)
	if want := []Offset{{TP: tp, Offset: 109}}; !slices.Equal(offsetsOf(h.tick().commit), want) {
		t.Fatalf("after 103 finished, want commit %v", want)
	}
}

func TestStateDropsResultsOfAnOlderEpoch(t *testing.T) {
	tp := stp(0)
	for _, tc := range []struct {
		name     string
		reassign func(h *harness)
	}{
		{"lost then assigned", func(h *harness) {
			if g, reply := h.lost(tp); !hasReply(g, reply) {
				h.t.Fatal("Lost not answered")
			}
			h.assign(0, tp)
		}},
		{"assigned again without a revoke", func(h *harness) { h.assign(0, tp) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.assign(0, tp)
			old := h.fetch(tp, 1, 0, 1, 2).work
			tc.reassign(h)
			// The new owner of the epoch gets the same records again.
			cur := h.fetch(tp, 1, 0, 1, 2).work
			if len(old) != 3 || len(cur) != 3 {
				t.Fatalf("dispatched %d, then %d tasks; want 3 and 3", len(old), len(cur))
			}
			// The old epoch's handlers finish: nothing of it counts.
			if g := h.finish(old...); g.commit != nil {
				t.Fatalf("old results committed %v", g.commit.offsets)
			}
			if c := h.tick().commit; c != nil {
				t.Fatalf("after the old epoch's results, tick committed %v", c.offsets)
			}
			// Only the current epoch's own completion moves the offset.
			h.finish(cur[0])
			if want := []Offset{{TP: tp, Offset: 1}}; !slices.Equal(offsetsOf(h.tick().commit), want) {
				t.Fatalf("want commit %v: the old epoch's results for 1 and 2 must not count", want)
			}
		})
	}
}

func hasReply(g got, ch chan sinkReply) bool {
	_, ok := g.answered(ch)
	return ok
}

func TestStateLostCommitsNothing(t *testing.T) {
	h := newHarness(t)
	tp := stp(0)
	h.assign(0, tp)
	ts := h.fetch(tp, 1, 0, 1, 2, 3, 4).work
	h.finish(ts[:3]...) // the safe offset is 3
	g, reply := h.lost(tp)
	if !hasReply(g, reply) || g.commit != nil {
		t.Fatalf("Lost with no commit in flight: answered %v, commit %v; want answered, no commit", hasReply(g, reply), offsetsOf(g.commit))
	}
	if g := h.finish(ts[3:]...); g.commit != nil {
		t.Fatalf("the lost partition's last results committed %v", g.commit.offsets)
	}
	if c := h.tick().commit; c != nil {
		t.Fatalf("tick committed %v for a lost partition", c.offsets)
	}
}

func TestStateLostWaitsForTheCommitInFlight(t *testing.T) {
	h := newHarness(t)
	tp := stp(0)
	h.assign(0, tp)
	ts := h.fetch(tp, 1, 0, 1, 2, 3, 4).work
	h.finish(ts[:3]...)
	c := h.tick().commit
	if want := []Offset{{TP: tp, Offset: 3}}; !slices.Equal(offsetsOf(c), want) {
		t.Fatalf("tick committed %v, want %v", offsetsOf(c), want)
	}
	// That commit may still reach the source: Lost is answered only once
	// it was answered, so the source cannot rejoin and send it under a
	// new generation.
	g, reply := h.lost(tp)
	if hasReply(g, reply) || g.commit != nil {
		t.Fatalf("Lost with a commit in flight: answered %v, commit %v; want neither", hasReply(g, reply), offsetsOf(g.commit))
	}
	h.finish(ts[3:]...)
	g = h.answer(c, nil)
	if !hasReply(g, reply) {
		t.Fatal("Lost not answered once the commit in flight was")
	}
	if g.commit != nil {
		t.Fatalf("the answer sent commit %v", g.commit.offsets)
	}
	if c := h.tick().commit; c != nil {
		t.Fatalf("tick committed %v for a lost partition", c.offsets)
	}
}

func TestStateRevokeDrainsThenCommits(t *testing.T) {
	tp := stp(0)
	for _, tc := range []struct {
		name string
		// end ends the drain of tasks 1..3 (0 finished before the revoke)
		// and returns its actions.
		end      func(h *harness, ts []*task) got
		want     int64 // the final commit's offset
		drainErr bool  // the revoke returns a *DrainError for tp at want
	}{
		{"its records finish", func(h *harness, ts []*task) got {
			if g := h.finish(ts[1:3]...); g.commit != nil {
				h.t.Fatalf("committed %v with a record in flight", g.commit.offsets)
			}
			return h.finish(ts[3])
		}, 4, false},
		{"its deadline passes", func(h *harness, ts []*task) got {
			h.clock = h.clock.Add(10*time.Second - 1)
			if g := h.do(h.s.drainDue()); g.commit != nil {
				h.t.Fatalf("committed %v before the deadline", g.commit.offsets)
			}
			h.clock = h.clock.Add(1)
			return h.do(h.s.drainDue())
		}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, DrainBudget(10*time.Second))
			h.assign(0, tp)
			ts := h.fetch(tp, 1, 0, 1, 2, 3).work
			h.finish(ts[0])
			g, reply := h.revoke(time.Time{}, tp)
			if _, ok := g.revokeAnswered(reply); ok || g.commit != nil {
				t.Fatalf("Revoked with records in flight: answered %v, commit %v", ok, offsetsOf(g.commit))
			}
			if want := h.clock.Add(10 * time.Second); !g.drainAt.Equal(want) {
				t.Fatalf("drain deadline %v, want %v", g.drainAt, want)
			}
			g = tc.end(h, ts)
			c := g.commit
			if want := []Offset{{TP: tp, Offset: tc.want}}; !slices.Equal(offsetsOf(c), want) {
				t.Fatalf("final commit %v, want %v", offsetsOf(c), want)
			}
			if _, ok := g.revokeAnswered(reply); ok {
				t.Fatal("Revoked answered before its final commit was")
			}
			g = h.answer(c, nil)
			err, ok := g.revokeAnswered(reply)
			if !ok {
				t.Fatal("Revoked not answered after its final commit")
			}
			var de *DrainError
			if errors.As(err, &de) != tc.drainErr {
				t.Fatalf("Revoked returned %v, want a DrainError: %v", err, tc.drainErr)
			}
			if de != nil && de.Unfinished[tp] != tc.want {
				t.Fatalf("DrainError %v, want %s unfinished at %d", de, tp, tc.want)
			}
			if h.s.parts[tp] != nil {
				t.Fatal("the revoked partition is still owned")
			}
		})
	}
}

// TestStateStopPausesAllResumesNothing: a stop pauses every partition not
// yet paused (a share source that polled again would acquire records only
// to release them, raising their delivery counts), no partition is resumed
// after it (the charge falling below the water marks does not lift a
// pause), the source's hand-overs are refused with ErrStopped, and the stop
// ends with its final commit.
func TestStateStopPausesAllResumesNothing(t *testing.T) {
	h := newHarness(t, WaterMarks(10, 4))
	p0, p1 := stp(0), stp(1)
	h.assign(0, p0, p1)
	g := h.fetch(p0, 1, 0, 1, 2, 3, 4, 5, 6, 7)
	if !slices.Equal(g.pause, []TP{p0}) {
		t.Fatalf("8 records paused %v, want %v", g.pause, p0)
	}
	ts := g.work
	g = h.do(h.s.stop(h.clock.Add(5*time.Second), time.Time{}, false))
	if len(g.resume) > 0 || !slices.Equal(g.pause, []TP{p1}) || g.commit != nil {
		t.Fatalf("stop resumed %v, paused %v and committed %v; want %v paused (the one not yet paused), nothing else", g.resume, g.pause, offsetsOf(g.commit), p1)
	}
	req := &sinkReq{kind: sinkFetched, reply: make(chan sinkReply, 1)}
	if rep, _ := h.do(h.s.reported(req)).answered(req.reply); !errors.Is(rep.err, ErrStopped) {
		t.Fatalf("Fetched after stop answered %v, want ErrStopped", rep.err)
	}
	for i, tk := range ts {
		g = h.finish(tk)
		if len(g.resume) > 0 {
			t.Fatalf("after %d of 8 finished while stopping: resumed %v", i+1, g.resume)
		}
	}
	c := g.commit
	if want := []Offset{{TP: p0, Offset: 8}}; !slices.Equal(offsetsOf(c), want) {
		t.Fatalf("final commit %v, want %v", offsetsOf(c), want)
	}
	h.answer(c, nil)
	if !h.s.finished || h.s.drainErr != nil {
		t.Fatalf("after the final commit: finished %v, err %v; want finished, nil", h.s.finished, h.s.drainErr)
	}
}
