//go:build integration

package integration_test

// Broker tests that close gaps listed in docs/guarantees.md: PartitionOrder
// across a rebalance (invariant 5), every acknowledged commit monotonic
// through a rebalance storm (invariant 2), and the Skip policy and
// HandlerTimeout on the real broker (invariant 9). The inbox handoffs
// (invariant 7) are in gaps_inbox_test.go.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// gapNoLeaks fails the test if a goroutine started during it is still
// alive once every cleanup has run (it is registered first, so its cleanup
// runs last: after the members, clients, pools and topics are gone).
func gapNoLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(opt); err != nil {
			t.Errorf("goroutines outlived the test: %v", err)
		}
	})
}

// gapFranz returns a franz Source on the test bed with the integration
// tests' usual timeouts; opts come after them.
func gapFranz(t *testing.T, group, topic string, opts ...franz.Option) *franz.Source {
	t.Helper()
	src, err := franz.New(bed.Kafka(t), group, []string{topic}, append([]franz.Option{
		franz.SessionTimeout(10 * time.Second), franz.RebalanceTimeout(20 * time.Second),
		franz.HeartbeatInterval(500 * time.Millisecond), franz.Logger(quietLogger()),
	}, opts...)...)
	if err != nil {
		t.Fatalf("franz.New: %v", err)
	}
	return src
}

// gapMember is one runner over any Source. It is stopped gracefully in the
// test's cleanup unless the test stopped it.
type gapMember struct {
	name string
	r    *runner.Runner
	done chan error
	once sync.Once
}

func gapStart(t *testing.T, name string, src runner.Source, topic string, h runner.Handler, opts ...runner.Option) *gapMember {
	t.Helper()
	r, err := runner.New(src, append([]runner.Option{runner.Handle(topic, h), runner.Logger(quietLogger()),
		runner.CommitInterval(100 * time.Millisecond), runner.DrainBudget(5 * time.Second)}, opts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	m := &gapMember{name: name, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop shuts the member down within 20 s and reports an error from
// Shutdown or Run; later calls do nothing.
func (m *gapMember) stop(t *testing.T) {
	t.Helper()
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.r.Shutdown(ctx); err != nil {
			t.Errorf("member %s: Shutdown: %v", m.name, err)
		}
		if err := <-m.done; err != nil {
			t.Errorf("member %s: Run: %v", m.name, err)
		}
	})
}

// gapWait polls cond every 20 ms and fails the test after within.
func gapWait(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// spyLog records, for every member wrapped by spySource, each assignment,
// revoke and loss it reports and each commit it sends and how the commit
// was answered, in the order they happened, and checks invariant 2 on every
// one of them (not on samples).
type spyLog struct {
	mu sync.Mutex
	// per member and partition: the current assignment's highest offset
	// sent and acknowledged; absent when the member does not own it.
	owned map[string]map[runner.TP]*spyAssignment
	// per partition: the last acknowledged commit by any member.
	lastAck     map[runner.TP]spyAck
	lost        map[string]int // member → partitions it reported lost
	assignments int
	sent, acked int
	violations  []string
}

type spyAssignment struct{ sent, acked int64 }

type spyAck struct {
	member string
	offset int64
}

func newSpyLog() *spyLog {
	return &spyLog{owned: map[string]map[runner.TP]*spyAssignment{}, lastAck: map[runner.TP]spyAck{}, lost: map[string]int{}}
}

func (l *spyLog) violate(format string, a ...any) {
	if len(l.violations) < 10 {
		l.violations = append(l.violations, fmt.Sprintf(format, a...))
	}
}

// ownedBy returns how many partitions member owns now.
func (l *spyLog) ownedBy(member string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.owned[member])
}

// spySource wraps a Source: its Run reports through a sink that records
// ownership in log, and its Commit records each offset sent and whether it
// was acknowledged.
type spySource struct {
	runner.Source
	name string
	log  *spyLog
}

func (s *spySource) Run(ctx context.Context, sink runner.Sink) error {
	return s.Source.Run(ctx, spySink{Sink: sink, s: s})
}

func (s *spySource) Commit(ctx context.Context, offsets []runner.Offset) error {
	l := s.log
	l.mu.Lock()
	for _, o := range offsets {
		a := l.owned[s.name][o.TP]
		switch {
		case a == nil:
			l.violate("member %s sent a commit of %d for %s, which it does not own", s.name, o.Offset, o.TP)
		case o.Offset < a.sent:
			l.violate("member %s sent %d for %s after sending %d in the same assignment", s.name, o.Offset, o.TP, a.sent)
		default:
			a.sent = o.Offset
		}
		l.sent++
	}
	l.mu.Unlock()

	err := s.Source.Commit(ctx, offsets)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range offsets {
		l.acked++
		if a := l.owned[s.name][o.TP]; a != nil {
			if o.Offset < a.acked {
				l.violate("member %s: %s acknowledged at %d after %d in the same assignment", s.name, o.TP, o.Offset, a.acked)
			}
			a.acked = max(a.acked, o.Offset)
		}
		// Across members: a clean handoff (revoke, final commit, then the
		// next assignment) keeps the group's committed offset rising too.
		if last, ok := l.lastAck[o.TP]; ok && o.Offset < last.offset {
			l.violate("%s: member %s's acknowledged commit %d is below member %s's earlier %d", o.TP, s.name, o.Offset, last.member, last.offset)
		}
		if last := l.lastAck[o.TP]; o.Offset >= last.offset {
			l.lastAck[o.TP] = spyAck{member: s.name, offset: o.Offset}
		}
	}
	return nil
}

type spySink struct {
	runner.Sink
	s *spySource
}

func (k spySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	l := k.s.log
	l.mu.Lock()
	if l.owned[k.s.name] == nil {
		l.owned[k.s.name] = map[runner.TP]*spyAssignment{}
	}
	for _, a := range parts {
		l.owned[k.s.name][a.TP] = &spyAssignment{sent: -1, acked: -1}
		l.assignments++
	}
	l.mu.Unlock()
	return k.Sink.Assigned(ctx, parts)
}

// Revoked and Lost end the assignment after the runner has acted: the
// final commit of a revoke, and a commit in flight that Lost waits for,
// still belong to it.
func (k spySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	err := k.Sink.Revoked(ctx, tps, deadline)
	k.s.log.drop(k.s.name, tps)
	return err
}

func (k spySink) Lost(ctx context.Context, tps []runner.TP) error {
	err := k.Sink.Lost(ctx, tps)
	k.s.log.drop(k.s.name, tps)
	k.s.log.mu.Lock()
	k.s.log.lost[k.s.name] += len(tps)
	k.s.log.mu.Unlock()
	return err
}

func (l *spyLog) drop(member string, tps []runner.TP) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, tp := range tps {
		delete(l.owned[member], tp)
	}
}

// TestPartitionOrderAcrossRebalance: PartitionOrder on the real broker
// (invariant 5). One member consumes four partitions with random handler
// latency; a second member joins mid-stream and the cooperative rebalance
// moves partitions to it while records are in flight. Across both members,
// never are two records of one partition running at once, and each
// partition's records start exactly in offset order, 0, 1, 2, ..., each
// once: the new owner starts where the old owner's drained final commit
// left off. A runner that dispatched a second record of a partition before
// the first finished, dispatched out of order, or a handoff that let the
// new owner start before the old one drained (or from the wrong offset),
// breaks one of these.
func TestPartitionOrderAcrossRebalance(t *testing.T) {
	gapNoLeaks(t)
	const n, partitions = 8000, 4
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "key-" + strconv.Itoa(i%64) })

	var (
		mu        sync.Mutex
		running   = map[int32]int{}            // partition → handlers running, all members
		seq       = map[int32][]int64{}        // partition → offsets in start order, all members
		by        = map[int32]map[string]int{} // partition → member → records
		violation string
		handled   atomic.Int64
	)
	h := func(name string) runner.Handler {
		return func(ctx context.Context, rec runner.Record) error {
			p := rec.Partition
			mu.Lock()
			if running[p]++; running[p] > 1 && violation == "" {
				violation = fmt.Sprintf("member %s started %s while another record of the partition ran", name, rec.String())
			}
			seq[p] = append(seq[p], rec.Offset)
			if by[p] == nil {
				by[p] = map[string]int{}
			}
			by[p][name]++
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			mu.Lock()
			running[p]--
			mu.Unlock()
			handled.Add(1)
			return nil
		}
	}
	log := newSpyLog()
	start := func(name string) *gapMember {
		src := &spySource{Source: gapFranz(t, group, topic), name: name, log: log}
		return gapStart(t, name, src, topic, h(name), runner.Order(runner.PartitionOrder), runner.Concurrency(8))
	}
	a := start("a")
	gapWait(t, time.Minute, "a handles a tenth of the records", func() bool { return handled.Load() >= n/10 })
	b := start("b")
	gapWait(t, time.Minute, "b owns partitions", func() bool { return log.ownedBy("b") > 0 })
	atJoin := handled.Load()
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	b.stop(t)
	a.stop(t)

	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	ends := bed.EndOffsets(t, topic)
	moved := 0
	for p := range int32(partitions) {
		s := seq[p]
		for i, off := range s {
			if off != int64(i) {
				t.Fatalf("partition %d: start %d was offset %d, want %d (out of order or replayed); around it: %v",
					p, i, off, i, s[max(0, i-3):min(len(s), i+3)])
			}
		}
		if int64(len(s)) != ends[p] {
			t.Fatalf("partition %d: %d records started, want %d", p, len(s), ends[p])
		}
		if by[p]["a"] > 0 && by[p]["b"] > 0 {
			moved++
		}
	}
	if moved == 0 || atJoin >= n {
		t.Fatalf("no partition moved mid-stream (handled per partition and member: %v; %d of %d handled when b got partitions): the handoff was not tested", by, atJoin, n)
	}
	t.Logf("%d partitions moved from a to b; %d of %d records handled when b got its first partition", moved, atJoin, n)
}

// TestCommitsNeverGoBackEachCommit: invariant 2 checked on every commit,
// not on samples. Members wrapped by spySource join and leave every
// 0.4–1 s for 5 s while 20,000 keyed records over six partitions are handled
// with random latency. Each commit a member sends is checked against what
// it sent before in the same assignment, each acknowledged one against what
// was acknowledged before in the same assignment, and against the last
// acknowledged commit of the partition by any member. A committer that
// resent an older safe offset after a newer one (a late answer, a failure
// resetting the sequencer), or a final commit below the new owner's first,
// fails it, even if a later commit covered it before a 100 ms sample.
func TestCommitsNeverGoBackEachCommit(t *testing.T) {
	gapNoLeaks(t)
	const n, partitions = 20_000, 6
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "key-" + strconv.Itoa(i%1000) })

	var handled atomic.Int64
	var storming atomic.Bool // slow handlers only while members come and go
	storming.Store(true)
	h := func(ctx context.Context, rec runner.Record) error {
		if storming.Load() {
			time.Sleep(time.Duration(rand.IntN(10_000)) * time.Microsecond)
		}
		handled.Add(1)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := watchCommits(t, ctx, group, topic) // the broker's view, sampled
	log := newSpyLog()
	var members []*gapMember
	k := 0
	add := func() {
		k++
		name := "m" + strconv.Itoa(k)
		src := &spySource{Source: gapFranz(t, group, topic), name: name, log: log}
		members = append(members, gapStart(t, name, src, topic, h, runner.Concurrency(8),
			runner.CommitInterval(20*time.Millisecond)))
	}
	for range 3 {
		add()
	}
	joins, leaves := 3, 0
	for stormEnd := time.Now().Add(5 * time.Second); time.Now().Before(stormEnd); {
		time.Sleep(time.Duration(400+rand.IntN(600)) * time.Millisecond)
		if len(members) >= 3 || (len(members) > 1 && rand.IntN(2) == 0) {
			i := rand.IntN(len(members))
			members[i].stop(t)
			members = append(members[:i], members[i+1:]...)
			leaves++
		} else {
			add()
			joins++
		}
	}
	stormHandled := handled.Load()
	storming.Store(false)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	for _, m := range members {
		m.stop(t)
	}
	cancel()

	watch.mu.Lock()
	if watch.violation != "" {
		t.Error("sampled:", watch.violation)
	}
	watch.mu.Unlock()
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, v := range log.violations {
		t.Error(v)
	}
	if log.assignments < 2*partitions || log.acked < 200 || stormHandled >= n {
		t.Fatalf("%d assignments, %d acknowledged commits, %d of %d records handled when the storm ended: too small a storm to test",
			log.assignments, log.acked, stormHandled, n)
	}
	t.Logf("%d joins, %d leaves, %d assignments; %d offsets sent, %d acknowledged, all checked; %d of %d records handled during the storm, %d handlings in all",
		joins, leaves, log.assignments, log.sent, log.acked, stormHandled, n, handled.Load())
}

// syncBuffer is a bytes.Buffer safe for the runner's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines decodes the JSON log lines written so far.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(s.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// counter returns the total of an Int64 counter read from reader.
func counter(t *testing.T, reader *metric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range s.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}

// TestSkipOnBroker: with Skip(3) a record that always fails is tried
// exactly three times, then logged at error level naming the record and
// its error, counted once in tidemark.records.skipped, and passed: the
// group's commit reaches the end of the partition (invariant 9). A Skip
// that completed the record early (fewer attempts), silently (no log line
// or count), or not at all (the commit stuck at the record) fails it.
func TestSkipOnBroker(t *testing.T) {
	gapNoLeaks(t)
	const n, poison = 20, 7
	topic, group := bed.Topic(t, 1), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "k" + strconv.Itoa(i) })

	var mu sync.Mutex
	calls := map[int64]int{}
	h := func(ctx context.Context, rec runner.Record) error {
		mu.Lock()
		calls[rec.Offset]++
		mu.Unlock()
		if rec.Offset == poison {
			return errors.New("cannot handle this one")
		}
		return nil
	}
	var logs syncBuffer
	reader := metric.NewManualReader()
	provider := metric.NewMeterProvider(metric.WithReader(reader))
	defer provider.Shutdown(context.Background()) //nolint:errcheck
	m := gapStart(t, "m", gapFranz(t, group, topic), topic, h,
		runner.Failure(runner.Skip(3)), runner.Backoff(5*time.Millisecond, 20*time.Millisecond),
		runner.Logger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		runner.MeterProvider(provider))
	waitCommitted(t, group, topic, map[int32]int64{0: n}, time.Minute)
	m.stop(t)

	mu.Lock()
	defer mu.Unlock()
	for off := range int64(n) {
		want := 1
		if off == poison {
			want = 3
		}
		if calls[off] != want {
			t.Errorf("offset %d: %d attempts, want %d", off, calls[off], want)
		}
	}
	if got := counter(t, reader, "tidemark.records.skipped"); got != 1 {
		t.Errorf("tidemark.records.skipped = %d, want 1", got)
	}
	rec := fmt.Sprintf("%s/0@%d", topic, poison)
	var skipped []map[string]any
	for _, l := range logs.lines(t) {
		if l["record"] == rec && l["msg"] == "record skipped after its last attempt" {
			skipped = append(skipped, l)
		}
	}
	if len(skipped) != 1 {
		t.Fatalf("%d log lines say %s was skipped, want 1; log:\n%s", len(skipped), rec, logs.b.String())
	}
	l := skipped[0]
	if l["level"] != "ERROR" || l["attempts"] != float64(3) || !containsAll(fmt.Sprint(l["err"]), "cannot handle this one") {
		t.Errorf("skip log line %v: want level ERROR, attempts 3 and the record's error", l)
	}
}

// TestHandlerTimeoutOnBroker: with HandlerTimeout(1.5s) an attempt that
// runs past it has its ctx ended with DeadlineExceeded and counts as a
// failed attempt (invariant 9): while it runs the group's commit stays at
// the record although every later record (other keys) is done, and the
// record is retried and then passed. A timeout that did not end the ctx,
// that completed the record instead of retrying it, or a commit that moved
// past the running attempt fails it.
func TestHandlerTimeoutOnBroker(t *testing.T) {
	gapNoLeaks(t)
	const n, slow, timeout = 10, 3, 1500 * time.Millisecond
	topic, group := bed.Topic(t, 1), bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return "k" + strconv.Itoa(i) })

	var (
		mu       sync.Mutex
		attempts int
		firstErr error
		firstDur time.Duration
		inFirst  = make(chan struct{})
	)
	h := func(ctx context.Context, rec runner.Record) error {
		if rec.Offset != slow {
			return nil
		}
		mu.Lock()
		attempts++
		a := attempts
		mu.Unlock()
		if a > 1 {
			return nil
		}
		close(inFirst)
		began := time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
		mu.Lock()
		firstErr, firstDur = ctx.Err(), time.Since(began)
		mu.Unlock()
		return ctx.Err()
	}
	m := gapStart(t, "m", gapFranz(t, group, topic), topic, h,
		runner.HandlerTimeout(timeout), runner.Backoff(5*time.Millisecond, 20*time.Millisecond))
	<-inFirst
	began := time.Now()
	waitCommitted(t, group, topic, map[int32]int64{0: slow}, time.Minute)
	mu.Lock()
	stillFirst := firstErr == nil && attempts == 1
	mu.Unlock()
	if !stillFirst {
		t.Fatalf("the first attempt ended (after %v) before the commit reached %d: too slow to check that the commit waited", time.Since(began), slow)
	}
	waitCommitted(t, group, topic, map[int32]int64{0: n}, time.Minute)
	m.stop(t)

	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(firstErr, context.DeadlineExceeded) {
		t.Errorf("first attempt's ctx ended with %v, want context.DeadlineExceeded", firstErr)
	}
	if firstDur < timeout-100*time.Millisecond || firstDur > timeout+2*time.Second {
		t.Errorf("first attempt lasted %v, want about the %v timeout", firstDur, timeout)
	}
	if attempts != 2 {
		t.Errorf("%d attempts of offset %d, want 2 (the timed-out one and its retry)", attempts, slow)
	}
}
