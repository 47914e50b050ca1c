package sourcetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// Timings every member of the suite uses unless a scenario says otherwise:
// short enough that rebalances and losses happen within seconds, long enough
// for a loaded CI machine running -race.
const (
	sessionTimeout    = 6 * time.Second
	rebalanceTimeout  = 10 * time.Second
	heartbeatInterval = 500 * time.Millisecond
	drainBudget       = 2 * time.Second
	commitInterval    = 100 * time.Millisecond
)

// env is one scenario: its factory, broker view and group.
type env struct {
	t     *testing.T
	f     Factory
	c     *kafkatest.Cluster
	group string
	board *board
}

func newEnv(t *testing.T, f Factory) *env {
	return &env{t: t, f: f, c: kafkatest.New(t, f.Brokers), group: kafkatest.Name(t, "group"), board: &board{owner: map[runner.TP]*spy{}}}
}

// board is who owns each partition according to the members' own reports:
// a member owns a partition from the moment its source reports it assigned
// until its revoke returns or its loss is reported. The group protocols
// never give a partition to a new owner before the old one has revoked it
// (or been removed from the group), so a commit a member starts while
// another member owns the partition must not be acknowledged: it would
// overwrite the new owner's progress.
type board struct {
	mu    sync.Mutex
	owner map[runner.TP]*spy
}

// member is one runner over one source of the adapter under test.
type member struct {
	name string
	spy  *spy
	r    *runner.Runner
	done chan error
	once sync.Once
}

// memberOpts adjusts one member: its Config, its spy (before it runs) and
// its runner.
type memberOpts struct {
	tune   func(*Config)
	spy    func(*spy)
	runner []runner.Option
}

// start builds a source with the factory and runs a runner over it with h
// registered for every topic. The member is stopped in cleanup if the
// scenario did not stop it.
func (e *env) start(name string, topics []string, h runner.Handler, o memberOpts) *member {
	t := e.t
	t.Helper()
	cfg := Config{
		Brokers:           e.f.Brokers,
		Group:             e.group,
		Topics:            topics,
		SessionTimeout:    sessionTimeout,
		RebalanceTimeout:  rebalanceTimeout,
		HeartbeatInterval: heartbeatInterval,
		Logger:            kafkatest.Logger(t).With("member", name),
	}
	if o.tune != nil {
		o.tune(&cfg)
	}
	src, err := e.f.New(cfg)
	if err != nil {
		t.Fatalf("sourcetest: %s: Factory.New: %v", name, err)
	}
	sp := newSpy(src)
	sp.name, sp.board = name, e.board
	if _, ok := src.(runner.Settler); ok {
		sp.settling, sp.outstanding, sp.settlements = true, map[recKey]int{}, map[runner.Settlement]int{}
	}
	if sp.settling != e.f.Capabilities.Share {
		src.Close()
		t.Fatalf("sourcetest: %s: the adapter declares Share %v, and its source is a runner.Settler: %v", name, e.f.Capabilities.Share, sp.settling)
	}
	if o.spy != nil {
		o.spy(sp)
	}
	opts := []runner.Option{runner.Logger(cfg.Logger), runner.DrainBudget(drainBudget)}
	if sp.settling {
		// A share source commits nothing, and the runner refuses Block
		// (the default) over it: a record retried forever would hold its
		// lock from every member.
		opts = append(opts, runner.Failure(runner.Skip(5)))
	} else {
		opts = append(opts, runner.CommitInterval(commitInterval))
	}
	for _, topic := range topics {
		opts = append(opts, runner.Handle(topic, h))
	}
	// WithOptionalSettle: the runner settles records through it (the spy
	// watching), sets the adapter's fetch limits and writes
	// dead letters through it, as it would without the spy.
	var observe func(runner.TP, int64, runner.Settlement)
	if sp.settling {
		observe = sp.settle
	}
	r, err := runner.New(kafkatest.WithOptionalSettle(sp, src, observe), append(opts, o.runner...)...)
	if err != nil {
		src.Close()
		t.Fatalf("sourcetest: %s: runner.New: %v", name, err)
	}
	m := &member{name: name, spy: sp, r: r, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := m.stop(); err != nil {
			t.Errorf("sourcetest: %s: Shutdown: %v", name, err)
		}
	})
	return m
}

// stop shuts the member down gracefully within 15s (its drain gets half
// of it: CommitTimeout, 10s, is more); see drainWithin.
func (m *member) stop() error { return m.drainWithin(0, 15*time.Second) }

// drainWithin shuts the member down gracefully: its handlers get drain to
// finish (zero: Shutdown's split of budget), the final commit and leaving
// the group what is left of budget. It returns Shutdown's error, or Run's
// when Shutdown's is nil. Later calls return nil.
func (m *member) drainWithin(drain, budget time.Duration) error {
	var err error
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if drain > 0 {
			err = m.r.ShutdownWithin(ctx, time.Now().Add(drain))
		} else {
			err = m.r.Shutdown(ctx)
		}
		if runErr := <-m.done; err == nil {
			err = runErr
		}
	})
	return err
}

// eventKind is an ownership report from a source to the runner.
type eventKind int

const (
	assigned eventKind = iota
	revoked
	lost
)

func (k eventKind) String() string { return [...]string{"assigned", "revoked", "lost"}[k] }

// event is one ownership report: when the source called the sink and when
// the sink returned.
type event struct {
	kind     eventKind
	tps      []runner.TP
	at, done time.Time
}

func (e event) String() string {
	return fmt.Sprintf("%s %v at %s", e.kind, e.tps, e.at.Format("15:04:05.000000"))
}

// spy wraps the adapter's Source and the runner's Sink and records what
// crosses between them, checking the contract as it goes.
type spy struct {
	runner.Source
	name  string
	board *board

	mu     sync.Mutex
	events []event
	owned  map[runner.TP]bool
	// lostAt holds the partitions reported lost and not assigned again
	// since, with the time of the report.
	lostAt    map[runner.TP]time.Time
	violation string // the first breach of the contract seen

	budget    int                 // the budget the last hand-over returned; 0 before any
	handOvers int                 // Fetched calls
	delivered map[runner.TP]int64 // records handed over per partition
	pauses    int
	resumes   int
	closedAt  time.Time

	// completed, when set, returns a partition's completed handler calls;
	// with it the spy tracks the most records of one partition handed
	// over and not completed (buffered plus in flight).
	completed func(runner.TP) int64
	maxHeld   int64

	// onRevoke, when set, is called as a revoke reaches the runner.
	onRevoke func(tps []runner.TP)

	// settling: the adapter settles records (a share adapter); the spy
	// then counts each record handed over and not yet settled, and the
	// settlements by outcome.
	settling    bool
	outstanding map[recKey]int
	settlements map[runner.Settlement]int
}

func newSpy(src runner.Source) *spy {
	return &spy{Source: src, board: &board{owner: map[runner.TP]*spy{}}, owned: map[runner.TP]bool{}, lostAt: map[runner.TP]time.Time{}, delivered: map[runner.TP]int64{}}
}

func (s *spy) fail(format string, a ...any) {
	if s.violation == "" {
		s.violation = fmt.Sprintf(format, a...)
	}
}

// Run hands the adapter a recording Sink.
func (s *spy) Run(ctx context.Context, sink runner.Sink) error {
	return s.Source.Run(ctx, spySink{Sink: sink, s: s})
}

func (s *spy) Pause(tps []runner.TP) {
	s.mu.Lock()
	s.pauses++
	s.mu.Unlock()
	s.Source.Pause(tps)
}

func (s *spy) Resume(tps []runner.TP) {
	s.mu.Lock()
	s.resumes++
	s.mu.Unlock()
	s.Source.Resume(tps)
}

// Commit checks invariant 4 at the adapter: a commit that starts after a
// partition was reported lost (and before it was assigned again), or while
// another member owns it (see board), must not be acknowledged for it; the
// adapter must leave it out and say so.
func (s *spy) Commit(ctx context.Context, offsets []runner.Offset) error {
	s.mu.Lock()
	var lostBefore []runner.TP
	for _, o := range offsets {
		if _, ok := s.lostAt[o.TP]; ok {
			lostBefore = append(lostBefore, o.TP)
		}
	}
	if !s.closedAt.IsZero() {
		s.fail("Commit(%v) after Close", offsets)
	}
	if s.settling {
		s.fail("Commit(%v) over an adapter that settles its records", offsets)
	}
	s.mu.Unlock()
	var others []string
	s.board.mu.Lock()
	for _, o := range offsets {
		if ow := s.board.owner[o.TP]; ow != nil && ow != s {
			others = append(others, o.TP.String()+" (owned by "+ow.name+")")
		}
	}
	s.board.mu.Unlock()
	err := s.Source.Commit(ctx, offsets)
	if err == nil && (len(lostBefore) > 0 || len(others) > 0) {
		s.mu.Lock()
		if len(lostBefore) > 0 {
			s.fail("Commit(%v) acknowledged after %v were reported lost", offsets, lostBefore)
		}
		if len(others) > 0 {
			s.fail("Commit(%v) acknowledged for %v: another member was assigned them before the commit began", offsets, others)
		}
		s.mu.Unlock()
	}
	return err
}

func (s *spy) Close() error {
	s.mu.Lock()
	if s.closedAt.IsZero() {
		s.closedAt = time.Now()
	}
	s.mu.Unlock()
	return s.Source.Close()
}

// ownedCount is how many partitions the source has assigned and neither
// revoked nor lost.
func (s *spy) ownedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owned)
}

func (s *spy) ownedSet() []runner.TP {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []runner.TP
	for tp := range s.owned {
		out = append(out, tp)
	}
	sortTPs(out)
	return out
}

// eventsSince returns the events whose call started at or after t.
func (s *spy) eventsSince(t time.Time) []event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []event
	for _, e := range s.events {
		if !e.at.Before(t) {
			out = append(out, e)
		}
	}
	return out
}

func (s *spy) check(t *testing.T, name string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.violation != "" {
		t.Errorf("%s: %s", name, s.violation)
	}
}

// disown takes tps off the board where s owns them.
func (s *spy) disown(tps []runner.TP) {
	s.board.mu.Lock()
	for _, tp := range tps {
		if s.board.owner[tp] == s {
			delete(s.board.owner, tp)
		}
	}
	s.board.mu.Unlock()
}

// spySink records the reports and forwards them to the runner.
type spySink struct {
	runner.Sink
	s *spy
}

func (k spySink) record(kind eventKind, tps []runner.TP, at time.Time) {
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, event{kind: kind, tps: slices.Clone(tps), at: at, done: time.Now()})
}

func (k spySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	at := time.Now()
	s := k.s
	tps := make([]runner.TP, len(parts))
	s.mu.Lock()
	for i, a := range parts {
		tps[i] = a.TP
		if s.owned[a.TP] {
			s.fail("%s assigned again without a revoke or loss", a.TP)
		}
	}
	s.mu.Unlock()
	err := k.Sink.Assigned(ctx, parts)
	// Own the partitions and record the event in one step, once the runner
	// has acted: a test that waits for ownership then reads the events
	// must find this one (it did not when ownership came first).
	s.board.mu.Lock()
	for _, tp := range tps {
		s.board.owner[tp] = s
	}
	s.board.mu.Unlock()
	s.mu.Lock()
	for _, tp := range tps {
		s.owned[tp] = true
		delete(s.lostAt, tp)
	}
	s.events = append(s.events, event{kind: assigned, tps: slices.Clone(tps), at: at, done: time.Now()})
	s.mu.Unlock()
	return err
}

func (k spySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	at := time.Now()
	if k.s.onRevoke != nil {
		k.s.onRevoke(tps)
	}
	err := k.Sink.Revoked(ctx, tps, deadline)
	s := k.s
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.owned, tp)
	}
	s.mu.Unlock()
	s.disown(tps)
	k.record(revoked, tps, at)
	return err
}

func (k spySink) Lost(ctx context.Context, tps []runner.TP) error {
	at := time.Now()
	s := k.s
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.owned, tp)
		if _, ok := s.lostAt[tp]; !ok {
			s.lostAt[tp] = at
		}
	}
	s.mu.Unlock()
	s.disown(tps)
	err := k.Sink.Lost(ctx, tps)
	k.record(lost, tps, at)
	return err
}

// Fetched checks that the hand-over carries at most the budget the previous
// one returned and only partitions the source owns.
func (k spySink) Fetched(ctx context.Context, batches []runner.Batch) (int, error) {
	s := k.s
	s.mu.Lock()
	n := 0
	for _, b := range batches {
		n += len(b.Records)
		if len(b.Records) > 0 && !s.owned[b.TP] {
			s.fail("records of %s handed over while it is not assigned", b.TP)
		}
		for i := 1; i < len(b.Records); i++ {
			if b.Records[i].Offset <= b.Records[i-1].Offset {
				s.fail("records of %s handed over out of offset order: %d after %d", b.TP, b.Records[i].Offset, b.Records[i-1].Offset)
			}
		}
		if nr := len(b.Records); nr > 0 && b.Position >= 0 && b.Position <= b.Records[nr-1].Offset {
			s.fail("batch of %s has position %d at or before its last record %d", b.TP, b.Position, b.Records[nr-1].Offset)
		}
		s.delivered[b.TP] += int64(len(b.Records))
		if s.settling {
			for _, r := range b.Records {
				s.outstanding[recKey{b.TP, r.Offset}]++
			}
		}
		if s.completed != nil {
			s.maxHeld = max(s.maxHeld, s.delivered[b.TP]-s.completed(b.TP))
		}
	}
	if s.budget > 0 && n > s.budget {
		s.fail("a hand-over of %d records after the runner's budget of %d", n, s.budget)
	}
	s.handOvers++
	s.mu.Unlock()
	budget, err := k.Sink.Fetched(ctx, batches)
	if err == nil {
		s.mu.Lock()
		s.budget = budget
		s.mu.Unlock()
	}
	return budget, err
}

func sortTPs(tps []runner.TP) {
	slices.SortFunc(tps, func(a, b runner.TP) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
}
