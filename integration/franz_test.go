//go:build integration

package integration

// Tests of the franz source adapter (pkg/source/franz) under a runner,
// against the test bed's real Kafka broker.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// franzLogger logs at warn level, or at TIDEMARK_TEST_LOG (debug, info),
// to the test's output.
func franzLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	switch os.Getenv("TIDEMARK_TEST_LOG") {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// franzLedger records every handler call of one or more members.
type franzLedger struct {
	mu    sync.Mutex
	calls map[runner.TP]map[int64]int // partition → offset → calls
	byKey map[string][]int64          // partition|key → offsets in call order
	n     int
}

func newFranzLedger() *franzLedger {
	return &franzLedger{calls: map[runner.TP]map[int64]int{}, byKey: map[string][]int64{}}
}

func (l *franzLedger) add(rec runner.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tp := rec.TP()
	if l.calls[tp] == nil {
		l.calls[tp] = map[int64]int{}
	}
	l.calls[tp][rec.Offset]++
	k := tp.String() + "|" + string(rec.Key)
	l.byKey[k] = append(l.byKey[k], rec.Offset)
	l.n++
}

func (l *franzLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// franzMissing returns the first offset below the end of a partition of
// topic that no ledger handled, or "" when every one was.
func franzMissing(topic string, ends map[int32]int64, ls ...*franzLedger) string {
	for p, end := range ends {
		tp := runner.TP{Topic: topic, Partition: p}
		for off := range end {
			seen := false
			for _, l := range ls {
				l.mu.Lock()
				seen = seen || l.calls[tp][off] > 0
				l.mu.Unlock()
			}
			if !seen {
				return fmt.Sprintf("%s@%d", tp, off)
			}
		}
	}
	return ""
}

// franzSpy wraps a Source and records the ownership it reports.
type franzSpy struct {
	*franz.Source
	mu    sync.Mutex
	owned map[runner.TP]bool
	lost  map[runner.TP]time.Time
}

func (s *franzSpy) Run(ctx context.Context, sink runner.Sink) error {
	return s.Source.Run(ctx, franzSpySink{Sink: sink, s: s})
}

func (s *franzSpy) ownedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owned)
}

func (s *franzSpy) lostTPs() map[runner.TP]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[runner.TP]time.Time{}
	for tp, at := range s.lost {
		out[tp] = at
	}
	return out
}

type franzSpySink struct {
	runner.Sink
	s *franzSpy
}

func (k franzSpySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	err := k.Sink.Assigned(ctx, parts)
	k.s.mu.Lock()
	for _, a := range parts {
		k.s.owned[a.TP] = true
	}
	k.s.mu.Unlock()
	return err
}

func (k franzSpySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	err := k.Sink.Revoked(ctx, tps, deadline)
	k.s.mu.Lock()
	for _, tp := range tps {
		delete(k.s.owned, tp)
	}
	k.s.mu.Unlock()
	return err
}

func (k franzSpySink) Lost(ctx context.Context, tps []runner.TP) error {
	k.s.mu.Lock()
	for _, tp := range tps {
		delete(k.s.owned, tp)
		if _, ok := k.s.lost[tp]; !ok {
			k.s.lost[tp] = time.Now()
		}
	}
	k.s.mu.Unlock()
	return k.Sink.Lost(ctx, tps)
}

// franzMember is one runner over one franz Source on the test bed.
type franzMember struct {
	src  *franzSpy
	r    *runner.Runner
	done chan error
}

func franzStart(t *testing.T, group, topic string, h runner.Handler, fopts []franz.Option, ropts ...runner.Option) *franzMember {
	t.Helper()
	fopts = append([]franz.Option{
		franz.Logger(franzLogger(t)),
		franz.SessionTimeout(6 * time.Second),
		franz.HeartbeatInterval(time.Second),
		franz.RebalanceTimeout(20 * time.Second),
	}, fopts...)
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, fopts...)
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	spy := &franzSpy{Source: src, owned: map[runner.TP]bool{}, lost: map[runner.TP]time.Time{}}
	r, err := runner.New(spy, append([]runner.Option{
		runner.Handle(topic, h),
		runner.Logger(franzLogger(t)),
		runner.CommitInterval(100 * time.Millisecond),
		runner.DrainBudget(5 * time.Second),
	}, ropts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	m := &franzMember{src: spy, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { m.shutdown(t) })
	return m
}

// shutdown stops the member gracefully; later calls do nothing.
func (m *franzMember) shutdown(t *testing.T) {
	t.Helper()
	if m.done == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.r.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-m.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	m.done = nil
}

func franzWait(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// franzOffsets reads end and committed offsets through one admin client,
// for conditions polled many times (bed.Committed and bed.EndOffsets open a
// client per call).
type franzOffsets struct {
	t   *testing.T
	adm *kadm.Client
}

func newFranzOffsets(t *testing.T) *franzOffsets { return &franzOffsets{t: t, adm: bed.Admin(t)} }

func (o *franzOffsets) ends(topic string) map[int32]int64 {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := o.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		o.t.Fatalf("end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	listed.Each(func(l kadm.ListedOffset) { out[l.Partition] = l.Offset })
	return out
}

// committed returns group's committed offsets on topic, -1 where none.
func (o *franzOffsets) committed(group, topic string) map[int32]int64 {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := o.adm.FetchOffsetsForTopics(ctx, group, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		o.t.Fatalf("committed offsets of %s on %s: %v", group, topic, err)
	}
	out := map[int32]int64{}
	resp.Each(func(r kadm.OffsetResponse) { out[r.Partition] = r.At })
	return out
}

// atEnd reports whether group committed the end offset of every partition
// of topic.
func (o *franzOffsets) atEnd(group, topic string) func() bool {
	return func() bool {
		ends, got := o.ends(topic), o.committed(group, topic)
		for p, end := range ends {
			if got[p] != end {
				return false
			}
		}
		return true
	}
}

// franzCommit is one sample of a group's committed offset.
type franzCommit struct {
	at       time.Time
	offset   int64
	metadata string // the committing member's id (franz-go writes it)
}

// franzSampler polls a group's committed offsets every 100ms and keeps
// every change, per partition.
type franzSampler struct {
	mu      sync.Mutex
	history map[int32][]franzCommit
	errs    []error
	stop    chan struct{}
	done    chan struct{}
}

func franzSample(t *testing.T, group, topic string) *franzSampler {
	adm := bed.Admin(t)
	s := &franzSampler{history: map[int32][]franzCommit{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := adm.FetchOffsetsForTopics(ctx, group, topic)
			cancel()
			now := time.Now()
			s.mu.Lock()
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				s.errs = append(s.errs, err)
			} else {
				resp.Each(func(o kadm.OffsetResponse) {
					if o.At < 0 {
						return
					}
					h := s.history[o.Partition]
					if n := len(h); n == 0 || h[n-1].offset != o.At || h[n-1].metadata != o.Metadata {
						s.history[o.Partition] = append(h, franzCommit{at: now, offset: o.At, metadata: o.Metadata})
					}
				})
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *franzSampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// backward returns a description of the first committed offset that went
// backward, or "".
func (s *franzSampler) backward() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, h := range s.history {
		for i := 1; i < len(h); i++ {
			if h[i].offset < h[i-1].offset {
				return fmt.Sprintf("partition %d: committed %d (member %s) after %d (member %s)", p, h[i].offset, h[i].metadata, h[i-1].offset, h[i-1].metadata)
			}
		}
	}
	return ""
}

func (s *franzSampler) samples() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.history {
		n += len(h)
	}
	return n
}

func franzKey(i int) string { return fmt.Sprintf("key-%03d", i%256) }

func franzRecord(l *franzLedger) runner.Handler {
	return func(_ context.Context, rec runner.Record) error {
		l.add(rec)
		return nil
	}
}

// TestFranzConsumeAll: one runner consumes 20,000 keyed records from six
// partitions: every record is handled exactly once, each key's records in
// offset order, and the group commits the end offsets.
func TestFranzConsumeAll(t *testing.T) {
	const n = 20_000
	topic, group := bed.Topic(t, 6), bed.Group(t)
	offs := newFranzOffsets(t)
	bed.Produce(t, topic, n, franzKey)
	l := newFranzLedger()
	m := franzStart(t, group, topic, franzRecord(l), nil)
	franzWait(t, 2*time.Minute, "every record handled", func() bool { return l.count() >= n })
	franzWait(t, 30*time.Second, "committed == end offsets", offs.atEnd(group, topic))
	m.shutdown(t)

	ends := bed.EndOffsets(t, topic)
	var total int64
	for _, end := range ends {
		total += end
	}
	if total != n {
		t.Fatalf("end offsets %v sum to %d, want %d", ends, total, n)
	}
	if miss := franzMissing(topic, ends, l); miss != "" {
		t.Errorf("%s never handled", miss)
	}
	if got := l.count(); got != n {
		t.Errorf("%d handler calls, want exactly %d (one per record)", got, n)
	}
	for key, offs := range l.byKey {
		if !slices.IsSorted(offs) {
			t.Errorf("key %s handled out of offset order: %v", key, offs)
		}
	}
}

// TestFranzTwoMembers: a second member joins mid-stream and later the first
// one shuts down: every record is handled at least once, the group commits
// the end offsets, and no committed offset ever goes backward. It runs with
// cooperative rebalances (the default), eager ones, and static members
// (whose Close does not leave the group: the second member gets the
// partitions when the first one's session expires).
func TestFranzTwoMembers(t *testing.T) {
	cases := []struct {
		name string
		opts func(member string) []franz.Option
	}{
		{"cooperative", func(string) []franz.Option { return nil }},
		{"eager", func(string) []franz.Option { return []franz.Option{franz.Eager()} }},
		{"static", func(m string) []franz.Option { return []franz.Option{franz.InstanceID(m)} }},
		// KIP-848: the broker assigns (Kafka 4.x's consumer group protocol).
		{"kip848", func(string) []franz.Option { return []franz.Option{franz.ServerSideAssignment()} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { franzTwoMembers(t, tc.opts) })
	}
}

func franzTwoMembers(t *testing.T, opts func(member string) []franz.Option) {
	const chunks, per = 20, 1000
	topic, group := bed.Topic(t, 6), bed.Group(t)
	offs := newFranzOffsets(t)
	sampler := franzSample(t, group, topic)
	la, lb := newFranzLedger(), newFranzLedger()
	slow := func(l *franzLedger) runner.Handler {
		return func(_ context.Context, rec runner.Record) error {
			time.Sleep(time.Millisecond)
			l.add(rec)
			return nil
		}
	}
	a := franzStart(t, group, topic, slow(la), opts("a"), runner.Concurrency(8))
	franzWait(t, 30*time.Second, "the first member owns every partition", func() bool { return a.src.ownedCount() == 6 })
	var b *franzMember
	for c := range chunks {
		bed.Produce(t, topic, per, func(i int) string { return franzKey(c*per + i) })
		switch c {
		case 6:
			b = franzStart(t, group, topic, slow(lb), opts("b"), runner.Concurrency(8))
		case 13:
			franzWait(t, 30*time.Second, "both members own partitions", func() bool {
				return a.src.ownedCount() > 0 && b.src.ownedCount() > 0
			})
			a.shutdown(t)
		}
		time.Sleep(100 * time.Millisecond)
	}
	franzWait(t, 30*time.Second, "the second member owns every partition", func() bool { return b.src.ownedCount() == 6 })
	franzWait(t, 2*time.Minute, "committed == end offsets", offs.atEnd(group, topic))
	time.Sleep(300 * time.Millisecond) // a few more samples
	b.shutdown(t)
	sampler.close()

	ends := bed.EndOffsets(t, topic)
	if miss := franzMissing(topic, ends, la, lb); miss != "" {
		t.Errorf("%s never handled", miss)
	}
	if la.count() == 0 || lb.count() == 0 {
		t.Errorf("members handled %d and %d records; want both > 0", la.count(), lb.count())
	}
	if back := sampler.backward(); back != "" {
		t.Errorf("committed offset went backward: %s", back)
	}
	if len(sampler.errs) > 0 {
		t.Errorf("sampling committed offsets failed %d times, first: %v", len(sampler.errs), sampler.errs[0])
	}
	t.Logf("handled %d + %d records for %d; %d committed-offset changes sampled", la.count(), lb.count(), chunks*per, sampler.samples())
}

// TestFranzTransactions: with committed and aborted transactions, every
// committed record is handled exactly once, no aborted one is handled, and
// the committed offset reaches the end offset past the last transaction
// marker (lag 0).
func TestFranzTransactions(t *testing.T) {
	const txns, per, parts = 30, 30, 3
	topic, group := bed.Topic(t, parts), bed.Group(t)
	offs := newFranzOffsets(t)
	p := bed.Client(t, kgo.TransactionalID(bed.Name(t, "txn")), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	committed := map[string]bool{}
	for x := range txns {
		// Every third transaction aborts, and so does the last, so each
		// partition ends with an abort marker.
		commit := x%3 != 1 && x != txns-1
		if err := p.BeginTransaction(); err != nil {
			t.Fatalf("begin transaction %d: %v", x, err)
		}
		var recs []*kgo.Record
		for i := range per {
			v := fmt.Sprintf("%t-%d-%d", commit, x, i)
			recs = append(recs, &kgo.Record{Partition: int32(i % parts), Key: []byte(franzKey(i)), Value: []byte(v)})
			if commit {
				committed[v] = true
			}
		}
		if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce in transaction %d: %v", x, err)
		}
		if err := p.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction %d: %v", x, err)
		}
	}

	var mu sync.Mutex
	got := map[string]int{}
	h := func(_ context.Context, rec runner.Record) error {
		mu.Lock()
		got[string(rec.Value)]++
		mu.Unlock()
		return nil
	}
	m := franzStart(t, group, topic, h, nil)
	franzWait(t, time.Minute, "committed == end offsets", offs.atEnd(group, topic))
	m.shutdown(t)

	ends := bed.EndOffsets(t, topic)
	for part, end := range ends {
		// per/parts records and one marker per transaction.
		if want := int64(txns * (per/parts + 1)); end != want {
			t.Errorf("partition %d ends at %d, want %d", part, end, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for v, n := range got {
		switch {
		case !committed[v]:
			t.Errorf("handled %s from an aborted transaction", v)
		case n != 1:
			t.Errorf("handled %s %d times", v, n)
		}
	}
	if len(got) != len(committed) {
		t.Errorf("handled %d distinct committed records, want %d", len(got), len(committed))
	}
}

// netSwitch is a franz-go Dialer whose connections can be cut: cut closes
// every open connection and fails new dials until restore, so the member
// can neither heartbeat nor commit, as if its host were partitioned away.
type netSwitch struct {
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

var errCut = errors.New("test: network cut")

func (s *netSwitch) dial(ctx context.Context, network, host string) (net.Conn, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return nil, errCut
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		c.Close()
		return nil, errCut
	}
	if s.conns == nil {
		s.conns = map[net.Conn]bool{}
	}
	s.conns[c] = true
	return c, nil
}

func (s *netSwitch) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = true
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
}

func (s *netSwitch) restore() {
	s.mu.Lock()
	s.down = false
	s.mu.Unlock()
}

// TestFranzLost: a member is cut off the network (every connection closed,
// every dial refused) with a handler blocked on each of its partitions; it
// loses its session (franz-go reports the loss as soon as a heartbeat
// fails; the broker expires the member after the session timeout) and its
// partitions move to a second member, which finishes them and more records
// produced meanwhile. With the network back, the first member rejoined under
// a new member id and the lost handlers completing late, the first member
// never commits for those partitions again: the committed offsets stay at
// the end, never go back, and no commit after the loss carries its old
// member id; the lost handlers' contexts were cancelled.
func TestFranzLost(t *testing.T) {
	const n, stuck = 2000, 20
	topic, group := bed.Topic(t, 2), bed.Group(t)
	offs := newFranzOffsets(t)
	bed.Produce(t, topic, n, franzKey)
	sampler := franzSample(t, group, topic)

	var (
		release  = make(chan struct{})
		mu       sync.Mutex
		blocked  = map[runner.TP]bool{}
		cancelOK = map[runner.TP]bool{} // the blocked handler saw its ctx end before release
		late     = map[runner.TP]bool{} // the blocked handler returned after release
	)
	la, lb := newFranzLedger(), newFranzLedger()
	hA := func(ctx context.Context, rec runner.Record) error {
		la.add(rec)
		if rec.Offset != stuck {
			return nil
		}
		tp := rec.TP()
		mu.Lock()
		blocked[tp] = true
		mu.Unlock()
		<-release // ignores ctx on purpose: its completion arrives late
		mu.Lock()
		cancelOK[tp] = ctx.Err() != nil
		late[tp] = true
		mu.Unlock()
		return nil
	}
	sw := &netSwitch{}
	a := franzStart(t, group, topic, hA, []franz.Option{franz.ClientOptions(kgo.Dialer(sw.dial))})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // let Shutdown finish on a failure path
		}
	}()
	franzWait(t, time.Minute, "the first member commits up to the blocked records", func() bool {
		got := offs.committed(group, topic)
		return got[0] == stuck && got[1] == stuck
	})
	oldID, _ := a.src.Client().GroupMetadata()
	if oldID == "" {
		t.Fatal("the first member has no member id")
	}

	sw.cut()
	cutAt := time.Now()
	// Records the first member never sees: a commit of its own progress
	// after the loss would now move the committed offsets backward.
	bed.Produce(t, topic, n, franzKey)
	b := franzStart(t, group, topic, franzRecord(lb), nil)
	franzWait(t, time.Minute, "the first member reports both partitions lost", func() bool { return len(a.src.lostTPs()) == 2 })
	franzWait(t, time.Minute, "the second member commits the end offsets", offs.atEnd(group, topic))
	t.Logf("lost %v after the cut; the second member finished", time.Since(cutAt).Round(time.Millisecond))

	sw.restore()
	franzWait(t, time.Minute, "the first member rejoins", func() bool {
		id, _ := a.src.Client().GroupMetadata()
		return id != "" && id != oldID
	})
	lostAt := time.Now()
	for _, at := range a.src.lostTPs() {
		if at.Before(lostAt) {
			lostAt = at
		}
	}
	close(release)
	franzWait(t, 10*time.Second, "the late completions", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(late) == 2
	})
	time.Sleep(3 * time.Second) // thirty commit intervals for a wrong commit to show

	ends := bed.EndOffsets(t, topic)
	got := bed.Committed(t, group, topic)
	for p, end := range ends {
		if got[p] != end {
			t.Errorf("partition %d committed %d after the late completions, want the end %d", p, got[p], end)
		}
	}
	sampler.close()
	if back := sampler.backward(); back != "" {
		t.Errorf("committed offset went backward: %s", back)
	}
	sampler.mu.Lock()
	for p, h := range sampler.history {
		for _, c := range h {
			if c.metadata == oldID && c.at.After(lostAt) {
				t.Errorf("partition %d: commit of %d by the lost member %s at %v, after it was lost", p, c.offset, oldID, c.at.Format(time.RFC3339Nano))
			}
		}
	}
	sampler.mu.Unlock()
	mu.Lock()
	for tp := range blocked {
		if !cancelOK[tp] {
			t.Errorf("%s: the lost partition's handler ctx was not cancelled", tp)
		}
	}
	mu.Unlock()

	a.shutdown(t)
	b.shutdown(t)
	if miss := franzMissing(topic, ends, la, lb); miss != "" {
		t.Errorf("%s never handled", miss)
	}
	var ids []string
	for _, m := range bed.Members(t, group) {
		ids = append(ids, m.MemberID)
	}
	t.Logf("members left: [%s]", strings.Join(ids, " "))
}
