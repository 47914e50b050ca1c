package share_test

// The share simulation: seeded schedules of members joining, stopping,
// killed and cut off, acks refused, records produced, handlers slow,
// failing and panicking, over kfake (which implements share groups, their
// locks, delivery limits and whole-partition ack refusals), with the
// promises of docs/share.md checked on the wire and at the end:
//
//   - no record is accepted before a handler attempt of it returned
//     success, none rejected before one failed (checked on every
//     ShareFetch and ShareAcknowledge the broker takes);
//   - no record reaches the delivery limit without a handler attempt, in
//     a schedule with no fault that takes deliveries away (a kill, a cut
//     connection, a refused ack, a stop; the client's buffering, which
//     the schedule can force);
//   - a record whose handler succeeded runs again only when such a fault
//     happened between the two attempts;
//   - a stop never accepts an unfinished record (the first promise: an
//     accept needs a finished attempt);
//   - every produced record is in the end acknowledged at the broker
//     (lag 0), accepted after a success or rejected by the policy, or,
//     where a fault explains it, archived: none vanishes.
//
// make test runs the seeds of TestSimShare; make sim runs it for longer.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/simtest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

func TestSimShare(t *testing.T) {
	t.Parallel()
	simtest.Run(t, simtest.Config{
		Name: "share", Seeds: 24, Parallel: 8,
		Replay: "go test -race -run TestSimShare ./pkg/source/share/ -sim.seed=%d",
	}, func(s *simtest.Sim) { newShareSim(s).run() })
}

const simTopic, simGroup = "t", "g"

// simKey is a record: partition and offset.
type simKey struct {
	p   int32
	off int64
}

func (k simKey) String() string { return fmt.Sprintf("%d@%d", k.p, k.off) }

// simAttempt is one handler call.
type simAttempt struct {
	member     int
	delivery   int32
	start, end time.Time
	done, ok   bool
}

// shareSim is one seed's world: the cluster, the members, the ledger of
// every handler attempt and every ack the broker took.
type shareSim struct {
	s      *simtest.Sim
	c      *kfake.Cluster
	prod   *kgo.Client
	lock   time.Duration
	limit  int
	parts  int32
	policy int // Skip(policy)

	mu       sync.Mutex
	produced []simKey
	attempts map[simKey][]*simAttempt
	accepted map[simKey]int
	rejected map[simKey]int
	// explained is the faults that take deliveries away: when, and from
	// which member (-1: from any).
	explained  []simFault
	faultRate  float64 // how often a step is a fault
	buffering  bool    // a member polls less than its fetches bring
	violations []string
	refuseAcks int // the next refuseAcks acknowledgements are refused
	converge   bool
	members    []*simMember
}

func newShareSim(s *simtest.Sim) *shareSim {
	return &shareSim{
		s: s, lock: simtest.Pick[time.Duration](s, 1200, 1800, 2500) * time.Millisecond,
		limit: simtest.Pick(s, 2, 3, 5), parts: int32(s.Intn(1, 3)), policy: s.Intn(1, 3),
		// A third of the schedules have no fault at all: there, any
		// lost delivery or second run is the source's.
		faultRate: simtest.Pick(s, 0, 0.15, 0.4),
		attempts:  map[simKey][]*simAttempt{}, accepted: map[simKey]int{}, rejected: map[simKey]int{},
	}
}

func (w *shareSim) violate(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// simFault is a fault that may take deliveries away from member (-1:
// from any member).
type simFault struct {
	at     time.Time
	member int
}

// explain records a fault of kind that may take deliveries away from
// member (-1: any), now.
func (w *shareSim) explain(kind string, member int) {
	w.s.Fault(kind)
	w.mu.Lock()
	w.explained = append(w.explained, simFault{time.Now(), member})
	w.mu.Unlock()
}

func (w *shareSim) run() {
	t := w.s.T
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(w.parts, simTopic), kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": strconv.FormatInt(w.lock.Milliseconds(), 10),
		"group.share.delivery.count.limit":    strconv.Itoa(w.limit),
		"share.record.lock.sweep.interval.ms": "50",
		// A killed member leaves the group within seconds.
		"group.share.session.timeout.ms":    "3000",
		"group.share.heartbeat.interval.ms": "500",
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w.c = c
	c.SetGroupConfigs(simGroup, map[string]string{"share.auto.offset.reset": "earliest"})
	c.Control(w.observe)
	w.prod, err = kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(simTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer w.prod.Close()
	w.s.Step("lock %v, delivery limit %d, %d partitions, Skip(%d), fault rate %.2f", w.lock, w.limit, w.parts, w.policy, w.faultRate)
	stopWatch := w.watchStalls()
	defer stopWatch()
	w.produce(w.s.Intn(10, 60))
	defer w.stopAll()

	w.startMember()
	// A number of steps, not a time: a seed's schedule is the same on
	// a loaded machine.
	for range w.s.Intn(6, 14) {
		time.Sleep(w.s.Dur(50*time.Millisecond, 450*time.Millisecond))
		if !w.step() {
			break
		}
	}
	w.finish()
}

// watchStalls counts as a fault of every member each time the process
// did not run for an eighth of the lock duration (half the margin the
// source keeps before a lock's known end): on a loaded machine the
// scheduler stops every goroutine, the client's and the broker's alike,
// for that long again and again, and together with the delay of the
// fetch response the source takes its lock deadline from (docs/share.md)
// a lock can run out under a record the runner holds. On a quiet machine
// no tick is that late, and every schedule checks the source alone. It
// returns the function that stops the watch.
func (w *shareSim) watchStalls() (stop func()) {
	const tick = 10 * time.Millisecond
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(tick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				now := time.Now()
				if now.Sub(last) > w.lock/8 {
					w.explain("scheduling stall", -1)
				}
				last = now
			}
		}
	}()
	return func() { close(done); <-ended }
}

// step takes one random step of the schedule; false when the schedule's
// cut is reached.
func (w *shareSim) step() bool {
	live := w.live()
	if !w.s.Chance(w.faultRate) {
		switch u := w.s.Rand.Float64(); {
		case u < 0.5:
			n := w.s.Intn(1, 20)
			if !w.s.Step("produce %d", n) {
				return false
			}
			w.produce(n)
		case u < 0.7 && len(live) < 3:
			return w.startMember()
		default:
			return w.s.Step("wait")
		}
		return true
	}
	switch u := w.s.Rand.Float64(); {
	case u < 0.25 && len(live) > 0:
		m := simtest.Pick(w.s, live...)
		budget := w.s.Dur(50*time.Millisecond, 2*time.Second)
		if !w.s.Step("stop member %d within %v", m.id, budget) {
			return false
		}
		w.explain("stop", m.id)
		m.stop(budget)
	case u < 0.5 && len(live) > 0:
		m := simtest.Pick(w.s, live...)
		if !w.s.Step("kill member %d", m.id) {
			return false
		}
		w.explain("kill", m.id)
		m.kill()
	case u < 0.75 && len(live) > 0:
		m := simtest.Pick(w.s, live...)
		if !w.s.Step("cut the connections of member %d", m.id) {
			return false
		}
		w.explain("cut", m.id)
		m.cut()
	case u < 0.9:
		n := w.s.Intn(1, 2)
		if !w.s.Step("refuse the next %d acknowledgements", n) {
			return false
		}
		w.mu.Lock()
		w.refuseAcks += n
		w.mu.Unlock()
	default:
		return w.s.Step("wait")
	}
	return true
}

func (w *shareSim) live() []*simMember {
	w.mu.Lock()
	defer w.mu.Unlock()
	var l []*simMember
	for _, m := range w.members {
		if m.alive() {
			l = append(l, m)
		}
	}
	return l
}

// produce appends n records, keys k0..k7, to random partitions.
func (w *shareSim) produce(n int) {
	t := w.s.T
	var recs []*kgo.Record
	for range n {
		p := int32(w.s.Rand.IntN(int(w.parts)))
		recs = append(recs, &kgo.Record{Partition: p, Key: []byte("k" + strconv.Itoa(w.s.Rand.IntN(8)))})
	}
	res := w.prod.ProduceSync(context.Background(), recs...)
	if err := res.FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
	w.mu.Lock()
	for _, r := range res {
		w.produced = append(w.produced, simKey{r.Record.Partition, r.Record.Offset})
	}
	w.mu.Unlock()
}

// refuseAcks is the broker's answer to r that refuses every partition's
// acks with INVALID_RECORD_STATE, and how many partitions it refused.
func refuseAcks(r *kmsg.ShareAcknowledgeRequest) (*kmsg.ShareAcknowledgeResponse, int) {
	resp := r.ResponseKind().(*kmsg.ShareAcknowledgeResponse)
	n := 0
	for _, tp := range r.Topics {
		rt := kmsg.NewShareAcknowledgeResponseTopic()
		rt.TopicID = tp.TopicID
		for _, p := range tp.Partitions {
			rp := kmsg.NewShareAcknowledgeResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, kerr.InvalidRecordState.Code
			rt.Partitions = append(rt.Partitions, rp)
			n++
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, n
}

// observe is the broker's view: every ack it takes is checked against the
// handler attempts, and refused when the schedule says so.
func (w *shareSim) observe(req kmsg.Request) (kmsg.Response, error, bool) {
	type batch struct {
		p           int32
		first, last int64
		types       []int8
	}
	var batches []batch
	switch r := req.(type) {
	case *kmsg.ShareFetchRequest:
		for _, tp := range r.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					batches = append(batches, batch{p.Partition, b.FirstOffset, b.LastOffset, b.AcknowledgeTypes})
				}
			}
		}
	case *kmsg.ShareAcknowledgeRequest:
		w.mu.Lock()
		refuse := w.refuseAcks > 0
		if refuse {
			w.refuseAcks--
		}
		w.mu.Unlock()
		if refuse {
			w.explain("refused ack", -1)
			resp, _ := refuseAcks(r)
			return resp, nil, true
		}
		for _, tp := range r.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					batches = append(batches, batch{p.Partition, b.FirstOffset, b.LastOffset, b.AcknowledgeTypes})
				}
			}
		}
	default:
		return nil, nil, false
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range batches {
		for off := b.first; off <= b.last; off++ {
			typ := b.types[0]
			if len(b.types) > 1 {
				typ = b.types[off-b.first]
			}
			k := simKey{b.p, off}
			switch typ {
			case 1: // ACCEPT
				if !w.finished(k, now, true) {
					w.violations = append(w.violations, fmt.Sprintf("%s accepted with no handler attempt returned success before (attempts %s)", k, w.describe(k)))
				}
				w.accepted[k]++
			case 3: // REJECT
				if !w.finished(k, now, false) {
					w.violations = append(w.violations, fmt.Sprintf("%s rejected with no handler attempt failed before (attempts %s)", k, w.describe(k)))
				}
				w.rejected[k]++
			}
		}
	}
	return nil, nil, false
}

// finished reports whether an attempt of k ended, with success ok, before
// now (under w.mu).
func (w *shareSim) finished(k simKey, now time.Time, ok bool) bool {
	for _, a := range w.attempts[k] {
		if a.done && a.ok == ok && !a.end.After(now) {
			return true
		}
	}
	return false
}

func (w *shareSim) describe(k simKey) string {
	var s []string
	for _, a := range w.attempts[k] {
		st := "running"
		if a.done {
			st = map[bool]string{true: "ok", false: "failed"}[a.ok]
		}
		s = append(s, fmt.Sprintf("member %d delivery %d %s", a.member, a.delivery, st))
	}
	return "[" + fmt.Sprint(s) + "]"
}

// outcome is a handler attempt's fate, drawn from the seed, the record
// and the attempt's number: the same on every replay of the seed.
type outcome struct {
	wait      time.Duration
	err       error
	permanent bool
	panics    bool
}

func (w *shareSim) outcome(k simKey, n int) outcome {
	r := rand.New(rand.NewPCG(w.s.Seed, uint64(k.p)<<48^uint64(k.off)<<8^uint64(n)))
	switch u := r.Float64(); {
	case u < 0.60:
		return outcome{wait: time.Duration(r.Int64N(int64(15 * time.Millisecond)))}
	case u < 0.72:
		// Around the lock: renewed, or the record is lost.
		return outcome{wait: time.Duration(float64(w.lock) * (0.3 + 1.1*r.Float64()))}
	case u < 0.82:
		return outcome{err: fmt.Errorf("retryable failure of %s", k)}
	case u < 0.88:
		return outcome{err: fmt.Errorf("permanent failure of %s", k), permanent: true}
	case u < 0.92:
		return outcome{panics: true}
	default:
		return outcome{wait: time.Duration(20+r.Int64N(200)) * time.Millisecond}
	}
}

func (w *shareSim) handler(member int) runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		k := simKey{rec.Partition, rec.Offset}
		a := &simAttempt{member: member, delivery: rec.DeliveryCount, start: time.Now()}
		w.mu.Lock()
		n := len(w.attempts[k])
		w.attempts[k] = append(w.attempts[k], a)
		conv := w.converge
		w.mu.Unlock()
		o := outcome{}
		if !conv {
			o = w.outcome(k, n)
		}
		ok := false
		defer func() {
			w.mu.Lock()
			a.end, a.done, a.ok = time.Now(), true, ok
			w.mu.Unlock()
		}()
		if o.wait > 0 {
			select {
			case <-time.After(o.wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		switch {
		case o.panics:
			panic("simulated handler panic on " + k.String())
		case o.permanent:
			return runner.Permanent(o.err)
		case o.err != nil:
			return o.err
		}
		ok = true
		return nil
	}
}

// simMember is one process: a share source and its runner, its
// connections to the broker, which the schedule can cut or kill.
type simMember struct {
	w    *shareSim
	id   int
	r    *runner.Runner
	errc chan error

	mu     sync.Mutex
	conns  []net.Conn
	dead   bool // killed: no dial succeeds
	ended  bool // stopped or killed
	cancel context.CancelFunc
}

func (m *simMember) alive() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.ended
}

func (m *simMember) dial(ctx context.Context, network, host string) (net.Conn, error) {
	m.mu.Lock()
	dead := m.dead
	m.mu.Unlock()
	if dead {
		return nil, fmt.Errorf("member %d is dead", m.id)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead {
		conn.Close()
		return nil, fmt.Errorf("member %d is dead", m.id)
	}
	m.conns = append(m.conns, conn)
	return conn, nil
}

func (m *simMember) cut() {
	m.mu.Lock()
	conns := m.conns
	m.conns = nil
	m.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// kill cuts the member off for good and ends its Run: nothing it still
// sends reaches the broker.
func (m *simMember) kill() {
	m.mu.Lock()
	m.dead, m.ended = true, true
	m.mu.Unlock()
	m.cut()
	m.cancel()
}

// stop shuts the member down within budget, in the background.
func (m *simMember) stop(budget time.Duration) {
	m.mu.Lock()
	m.ended = true
	m.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = m.r.Shutdown(ctx)
	}()
}

func (w *shareSim) startMember() bool {
	s := w.s
	sessions, poll := s.Intn(1, 3), s.Intn(1, 16)
	high := s.Intn(1, 24)
	low := s.Intn(0, high-1)
	conc := s.Intn(1, 8)
	pollCap := 0
	w.mu.Lock()
	id := len(w.members)
	conv := w.converge
	w.mu.Unlock()
	if !conv && s.Chance(0.35) {
		pollCap = s.Intn(1, poll)
	}
	if !s.Step("start member %d: Sessions(%d) MaxPollRecords(%d) WaterMarks(%d, %d) Concurrency(%d) buffering %d",
		id, sessions, poll, high, low, conc, pollCap) {
		return false
	}
	m := &simMember{w: w, id: id, errc: make(chan error, 1)}
	logger := slog.New(&simLog{w: w, member: id, Handler: slog.NewTextHandler(io.Discard, nil)})
	src, err := share.New(w.c.ListenAddrs(), simGroup, []string{simTopic}, share.Sessions(sessions), share.MaxPollRecords(poll),
		share.CloseTimeout(time.Second), share.Logger(logger),
		share.ClientOptions(kgo.FetchMaxWait(s.Dur(20*time.Millisecond, 200*time.Millisecond)), kgo.Dialer(m.dial)))
	if err != nil {
		s.T.Fatalf("share.New: %v", err)
	}
	if pollCap > 0 && pollCap < poll {
		src.PollCapForTest(pollCap)
		w.mu.Lock()
		w.buffering = true
		w.mu.Unlock()
	}
	m.r, err = runner.New(src, runner.Handle(simTopic, w.handler(id)), runner.Failure(runner.Skip(w.policy)),
		runner.WaterMarks(high, low), runner.Concurrency(conc),
		runner.Backoff(10*time.Millisecond, 50*time.Millisecond), runner.Logger(logger))
	if err != nil {
		s.T.Fatalf("runner.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { m.errc <- m.r.Run(ctx) }()
	w.mu.Lock()
	w.members = append(w.members, m)
	w.mu.Unlock()
	return true
}

// simLog counts, as faults of its member, the renewals the source says
// did not reach the broker in time and the fetches it says failed: on a
// loaded machine a lock can run out under a record the runner still
// holds, and the record runs again. A refused ack is not one of them:
// refusals are what the source must not bring upon itself.
type simLog struct {
	slog.Handler
	w      *shareSim
	member int
}

func (l *simLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && (strings.HasPrefix(r.Message, "renewing locks: acks not flushed") ||
		strings.HasPrefix(r.Message, "share fetch failed")) {
		l.w.explain("late renewal or failed fetch", l.member)
	}
	return l.Handler.Handle(ctx, r)
}

func (l *simLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &simLog{Handler: l.Handler.WithAttrs(as), w: l.w, member: l.member}
}

func (l *simLog) WithGroup(name string) slog.Handler {
	return &simLog{Handler: l.Handler.WithGroup(name), w: l.w, member: l.member}
}

// finish lets the handlers succeed, keeps a member running until every
// record is acknowledged at the broker, stops everyone and checks.
func (w *shareSim) finish() {
	t := w.s.T
	w.mu.Lock()
	w.converge = true
	w.refuseAcks = 0
	w.mu.Unlock()
	if len(w.live()) == 0 {
		w.startMember()
	}
	adm := kadm.NewClient(w.prod)
	deadline := time.Now().Add(30 * time.Second)
	for {
		lag, err := w.lag(adm)
		if err == nil && lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the share group's lag is %d (%v) 30 s after the schedule ended, want 0: records neither accepted, rejected nor archived", lag, err)
			break
		}
		// A member whose every session was refused may stall; one more
		// keeps the end in reach.
		if len(w.live()) == 0 {
			w.startMember()
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.stopAll()
	w.check()
}

// lag is the group's total share lag (an error until every partition has
// state).
func (w *shareSim) lag(adm *kadm.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds, err := adm.DescribeShareGroupOffsets(ctx, simGroup)
	if err != nil {
		return -1, err
	}
	var total int64
	for p := range w.parts {
		o, ok := ds[simGroup].Offsets.Lookup(simTopic, p)
		if !ok || o.Err != nil {
			return -1, fmt.Errorf("no share state for partition %d", p)
		}
		total += o.Lag
	}
	return total, nil
}

// stopAll shuts every member down and waits for every Run to return.
func (w *shareSim) stopAll() {
	w.mu.Lock()
	ms := slices.Clone(w.members)
	w.mu.Unlock()
	for _, m := range ms {
		if m.alive() {
			m.stop(5 * time.Second)
		}
	}
	for _, m := range ms {
		select {
		case err := <-m.errc:
			m.errc <- err
		case <-time.After(20 * time.Second):
			w.s.T.Errorf("member %d: Run did not return within 20 s of its stop", m.id)
		}
	}
}

func (w *shareSim) check() {
	t := w.s.T
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.violations {
		t.Error(v)
	}
	between := func(a, b *simAttempt, from, to time.Time) bool {
		for _, e := range w.explained {
			if (e.member == -1 || e.member == a.member || e.member == b.member) && !e.at.Before(from) && !e.at.After(to) {
				return true
			}
		}
		return false
	}
	for _, k := range w.produced {
		as := w.attempts[k]
		if len(as) == 0 {
			if len(w.explained) == 0 && !w.buffering {
				t.Errorf("%s was never handed to a handler (delivery limit %d), with no fault to explain it: archived unrun", k, w.limit)
			}
			continue
		}
		if w.accepted[k] == 0 && w.rejected[k] == 0 && len(w.explained) == 0 && !w.buffering {
			t.Errorf("%s: neither accepted nor rejected (attempts %s), with no fault to explain it", k, w.describe(k))
		}
		// A success and a later attempt: a fault of either member must
		// lie between them, or shortly before: a cut takes the
		// acquisitions its member held, whose records the member may
		// still run, late, after another member's success.
		for i, a := range as {
			if !a.done || !a.ok {
				continue
			}
			for _, b := range as[i+1:] {
				if !between(a, b, a.start.Add(-2*w.lock), b.start) {
					t.Errorf("%s ran again (member %d, delivery %d) after a success (member %d, delivery %d) with no fault between them",
						k, b.member, b.delivery, a.member, a.delivery)
				}
			}
		}
	}
}
