package kafkatest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Spy wraps a runner.Source and records the ownership it reports to the
// runner: a partition is owned from the return of the Assigned call that
// names it until the return of a Revoked call or the start of a Lost call
// that names it. Its methods are safe for concurrent use.
type Spy struct {
	runner.Source

	mu     sync.Mutex
	owned  map[runner.TP]bool
	lost   []runner.TP             // every partition reported lost, in order
	lostAt map[runner.TP]time.Time // the first loss report of each
	events []string
}

// NewSpy returns a Spy over src.
func NewSpy(src runner.Source) *Spy {
	return &Spy{Source: src, owned: map[runner.TP]bool{}, lostAt: map[runner.TP]time.Time{}}
}

// Run runs the Source with a Sink that records its reports and forwards
// them to sink.
func (s *Spy) Run(ctx context.Context, sink runner.Sink) error {
	return s.Source.Run(ctx, spySink{Sink: sink, s: s})
}

// Runnable returns s as a runner.Source that also implements each optional
// interface of the runner that the spied Source implements (see
// WithOptional).
func (s *Spy) Runnable() runner.Source { return WithOptional(s, s.Source) }

// WithOptional returns wrapper as a runner.Source that also implements each
// optional interface of the runner (runner.DeadLetterWriter,
// runner.FetchLimiter, runner.Settler, runner.Grouped) that inner, the
// Source it wraps, implements, so a runner over it behaves as over inner:
// it writes dead letters through it, sets its fetch limits, settles its
// records one by one and learns its group. A wrapper that embeds
// runner.Source alone hides them.
func WithOptional(wrapper, inner runner.Source) runner.Source {
	return WithOptionalSettle(wrapper, inner, nil)
}

// WithOptionalSettle is WithOptional, with observe (when not nil) called
// before each of inner's Settle calls: a spy's view of the settlements.
func WithOptionalSettle(wrapper, inner runner.Source, observe func(runner.TP, int64, runner.Settlement)) runner.Source {
	dlw, _ := inner.(runner.DeadLetterWriter)
	fl, _ := inner.(runner.FetchLimiter)
	var st runner.Settler
	if is, ok := inner.(runner.Settler); ok {
		st = is
		if observe != nil {
			st = settleFunc(func(tp runner.TP, off int64, s runner.Settlement) {
				observe(tp, off, s)
				is.Settle(tp, off, s)
			})
		}
	}
	// Grouped is always there: a Group of "" is what the runner takes for
	// a source without one.
	var g groupOf
	if gr, ok := inner.(runner.Grouped); ok {
		g = groupOf(gr.Group())
	}
	type (
		W = runner.DeadLetterWriter
		L = runner.FetchLimiter
		S = runner.Settler
		G = runner.Grouped
	)
	src := wrapper
	switch {
	case dlw != nil && fl != nil && st != nil:
		return struct {
			runner.Source
			W
			L
			S
			G
		}{src, dlw, fl, st, g}
	case dlw != nil && fl != nil:
		return struct {
			runner.Source
			W
			L
			G
		}{src, dlw, fl, g}
	case dlw != nil && st != nil:
		return struct {
			runner.Source
			W
			S
			G
		}{src, dlw, st, g}
	case fl != nil && st != nil:
		return struct {
			runner.Source
			L
			S
			G
		}{src, fl, st, g}
	case dlw != nil:
		return struct {
			runner.Source
			W
			G
		}{src, dlw, g}
	case fl != nil:
		return struct {
			runner.Source
			L
			G
		}{src, fl, g}
	case st != nil:
		return struct {
			runner.Source
			S
			G
		}{src, st, g}
	}
	return struct {
		runner.Source
		G
	}{src, g}
}

// settleFunc is a function as a runner.Settler.
type settleFunc func(runner.TP, int64, runner.Settlement)

func (f settleFunc) Settle(tp runner.TP, off int64, s runner.Settlement) { f(tp, off, s) }

// groupOf is a group's name as a runner.Grouped.
type groupOf string

func (g groupOf) Group() string { return string(g) }

// Owned returns the partitions owned now, sorted.
func (s *Spy) Owned() []runner.TP {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]runner.TP, 0, len(s.owned))
	for tp := range s.owned {
		out = append(out, tp)
	}
	slices.SortFunc(out, compareTP)
	return out
}

// OwnedCount is len(Owned()).
func (s *Spy) OwnedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owned)
}

// Lost returns every partition reported lost, in report order (a partition
// lost twice is there twice).
func (s *Spy) Lost() []runner.TP {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lost)
}

// LostAt returns when each partition ever reported lost was first reported.
func (s *Spy) LostAt() map[runner.TP]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[runner.TP]time.Time, len(s.lostAt))
	for tp, at := range s.lostAt {
		out[tp] = at
	}
	return out
}

// Events returns the reports in order, each as its kind and partitions:
// "assigned t/0 t/1", "revoked t/1", "lost t/0".
func (s *Spy) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func (s *Spy) event(kind string, tps []runner.TP) {
	e := kind
	for _, tp := range tps {
		e += " " + tp.String()
	}
	s.events = append(s.events, e)
}

type spySink struct {
	runner.Sink
	s *Spy
}

func (k spySink) Assigned(ctx context.Context, parts []runner.Assignment) error {
	err := k.Sink.Assigned(ctx, parts)
	tps := make([]runner.TP, len(parts))
	k.s.mu.Lock()
	for i, a := range parts {
		tps[i] = a.TP
		k.s.owned[a.TP] = true
	}
	k.s.event("assigned", tps)
	k.s.mu.Unlock()
	return err
}

func (k spySink) Revoked(ctx context.Context, tps []runner.TP, deadline time.Time) error {
	err := k.Sink.Revoked(ctx, tps, deadline)
	k.s.mu.Lock()
	for _, tp := range tps {
		delete(k.s.owned, tp)
	}
	k.s.event("revoked", tps)
	k.s.mu.Unlock()
	return err
}

func (k spySink) Lost(ctx context.Context, tps []runner.TP) error {
	now := time.Now()
	k.s.mu.Lock()
	for _, tp := range tps {
		delete(k.s.owned, tp)
		if _, ok := k.s.lostAt[tp]; !ok {
			k.s.lostAt[tp] = now
		}
	}
	k.s.lost = append(k.s.lost, tps...)
	k.s.event("lost", tps)
	k.s.mu.Unlock()
	return k.Sink.Lost(ctx, tps)
}

// Member is one runner over one spied Source.
type Member struct {
	Spy    *Spy
	Runner *runner.Runner

	name    string
	budget  time.Duration
	done    chan error
	stopped sync.Once
}

// Start wraps src in a Spy, builds a runner over its Runnable with opts and runs it
// until Stop or the test's cleanup, which shuts it down within budget.
// name (may be "") prefixes the member's errors. When runner.New fails,
// Start closes src and fails the test.
func Start(t testing.TB, name string, src runner.Source, budget time.Duration, opts ...runner.Option) *Member {
	t.Helper()
	sp := NewSpy(src)
	r, err := runner.New(sp.Runnable(), opts...)
	if err != nil {
		src.Close()
		t.Fatalf("%srunner.New: %v", prefix(name), err)
	}
	m := &Member{Spy: sp, Runner: r, name: name, budget: budget, done: make(chan error, 1)}
	go func() { m.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { m.Stop(t) })
	return m
}

// Stop shuts the member down gracefully within its budget and fails the
// test (t.Errorf) if Shutdown or Run returns an error. Later calls, and
// Close, do nothing.
func (m *Member) Stop(t testing.TB) {
	t.Helper()
	m.stopped.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.budget)
		defer cancel()
		if err := m.Runner.Shutdown(ctx); err != nil {
			t.Errorf("%sShutdown: %v", prefix(m.name), err)
		}
		if err := <-m.done; err != nil {
			t.Errorf("%sRun: %v", prefix(m.name), err)
		}
	})
}

// Close closes the member's runner at once (runner.Close: no drain, no
// final commit) and fails the test (t.Errorf) if Close or Run returns an
// error. Later calls, and Stop, do nothing.
func (m *Member) Close(t testing.TB) {
	t.Helper()
	m.stopped.Do(func() {
		if err := m.Runner.Close(); err != nil {
			t.Errorf("%sClose: %v", prefix(m.name), err)
		}
		if err := <-m.done; err != nil {
			t.Errorf("%sRun: %v", prefix(m.name), err)
		}
	})
}

func prefix(name string) string {
	if name == "" {
		return ""
	}
	return "member " + name + ": "
}
