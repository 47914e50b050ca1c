package shutdown_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
