package shutdown_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const topic = "t"

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, strings.TrimSpace(string(b))
}

// TestProbesWithARealRunner: liveness stays true while a handler is slow
// (the loop keeps ticking), readiness goes false at the start of a shutdown,
// and /statusz shows the age of the oldest unfinished record.
func TestProbesWithARealRunner(t *testing.T) {
	src := runnertest.New()
	src.Append(runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("k")})
	release := make(chan struct{})
	r, err := runner.New(src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), runner.CommitInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p := shutdown.NewProbes(r, 100*time.Millisecond)
	h := p.Handler()
	if code, _ := get(t, h, "/readyz"); code != 503 {
		t.Fatalf("readyz before start = %d, want 503", code)
	}
	p.Started()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	if err := src.Assign(context.Background(), runner.TP{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the handler is slow: 3x the stall limit
	if code, body := get(t, h, "/livez"); code != 200 {
		t.Fatalf("livez with a slow handler = %d %q, want 200", code, body)
	}
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Fatalf("readyz while running = %d, want 200", code)
	}
	code, body := get(t, h, "/statusz")
	if code != 200 || !strings.Contains(body, `"oldest_unfinished_seconds": 0.`) || !strings.Contains(body, `"in_flight": 1`) {
		t.Fatalf("statusz = %d %s, want the unfinished record's age", code, body)
	}
	p.Draining()
	if code, _ := get(t, h, "/readyz"); code != 503 {
		t.Fatalf("readyz while draining = %d, want 503", code)
	}
	close(release)
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// stub is a Runner whose loop can be wedged and whose Shutdown records when
// it was called.
type stub struct {
	mu        sync.Mutex
	loopAt    time.Time
	events    []string
	shutdown  func(ctx context.Context) error
	closed    bool
	readiness func() bool
}

func (s *stub) Stats() runner.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return runner.Stats{LoopAt: s.loopAt}
}

func (s *stub) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	ready := s.readiness()
	s.events = append(s.events, "shutdown(ready="+map[bool]string{true: "true", false: "false"}[ready]+")")
	s.mu.Unlock()
	return s.shutdown(ctx)
}

func (s *stub) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.events = append(s.events, "close")
	return nil
}

func TestLivenessFailsWhenTheLoopIsWedged(t *testing.T) {
	s := &stub{loopAt: time.Now().Add(-time.Minute)}
	p := shutdown.NewProbes(s, time.Second)
	p.Started()
	if ok, why := p.Live(); ok || !strings.Contains(why, "has not ticked") {
		t.Fatalf("Live = %v %q, want false: the loop's last tick is a minute old", ok, why)
	}
	s.loopAt = time.Now()
	if ok, _ := p.Live(); !ok {
		t.Fatal("Live = false with a fresh tick")
	}
}

func TestCoordinatorOrderAndBudget(t *testing.T) {
	s := &stub{}
	p := shutdown.NewProbes(s, 0)
	p.Started()
	s.readiness = func() bool { ok, _ := p.Ready(); return ok }
	var budgetLeft time.Duration
	s.shutdown = func(ctx context.Context) error {
		d, _ := ctx.Deadline()
		budgetLeft = time.Until(d)
		return nil
	}
	var order []string
	closer := func(name string) shutdown.Closer {
		return shutdown.Closer{Name: name, Close: func(ctx context.Context) error {
			order = append(order, name)
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("closer %s got no deadline", name)
			}
			return nil
		}}
	}
	c, err := shutdown.NewCoordinator(s, shutdown.Budget(10*time.Second), shutdown.WithProbes(p),
		shutdown.Close(closer("http"), closer("db"), closer("telemetry")))
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	err = c.Wait(context.Background(), sigs)
	if err != nil || shutdown.ExitCode(err) != 0 {
		t.Fatalf("Wait = %v (exit %d), want a clean stop", err, shutdown.ExitCode(err))
	}
	if strings.Join(s.events, ",") != "shutdown(ready=false)" {
		t.Fatalf("events %v: readiness must be off before the runner's Shutdown", s.events)
	}
	if budgetLeft <= 7*time.Second || budgetLeft > 8*time.Second {
		t.Fatalf("runner got %v of a 10s budget, want 80%%", budgetLeft)
	}
	if strings.Join(order, ",") != "http,db,telemetry" {
		t.Fatalf("closers ran %v, want in order", order)
	}
}

func TestCoordinatorDrainIncomplete(t *testing.T) {
	s := &stub{readiness: func() bool { return false }, shutdown: func(ctx context.Context) error {
		return &runner.DrainError{Unfinished: map[runner.TP]int64{{Topic: topic, Partition: 2}: 41}}
	}}
	c, _ := shutdown.NewCoordinator(s, shutdown.Budget(time.Second))
	err := c.Stop(nil)
	if code := shutdown.ExitCode(err); code != 3 || !strings.Contains(err.Error(), "t/2@41") {
		t.Fatalf("Stop = %v (exit %d), want exit 3 naming t/2@41", err, code)
	}
}

func TestSecondSignalStopsAtOnce(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	s := &stub{readiness: func() bool { return false }, shutdown: func(ctx context.Context) error {
		<-block
		return nil
	}}
	c, _ := shutdown.NewCoordinator(s, shutdown.Budget(time.Minute))
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	go func() {
		time.Sleep(20 * time.Millisecond)
		sigs <- syscall.SIGINT
	}()
	start := time.Now()
	err := c.Wait(context.Background(), sigs)
	if !errors.Is(err, shutdown.ErrForced) || shutdown.ExitCode(err) != 4 {
		t.Fatalf("Wait = %v, want ErrForced (exit 4)", err)
	}
	if time.Since(start) > 5*time.Second || !s.closed {
		t.Fatalf("second signal did not Close at once (closed %v)", s.closed)
	}
}

// TestExitCodes: each way a stop can end maps to its documented status.
func TestExitCodes(t *testing.T) {
	drain := &runner.DrainError{Unfinished: map[runner.TP]int64{{Topic: "t", Partition: 0}: 5}}
	final := &runner.FinalCommitError{Err: errors.New("coordinator unavailable")}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"clean", nil, 0},
		{"drain budget ran out", drain, 3},
		{"final commit failed", final, 3},
		{"both", errors.Join(drain, final), 3},
		{"forced", fmt.Errorf("stop: %w", shutdown.ErrForced), 4},
		{"other", errors.New("source failed"), 1},
	} {
		if got := shutdown.ExitCode(c.err); got != c.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
}
