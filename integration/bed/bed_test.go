//go:build integration

package bed_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tidemark/tidemark/integration/bed"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the calling goroutine, as the real one does, and whose Skip methods would
// skip the real test (so a helper that skips shows up as a skipped test).
type fatalRecorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = "fatal: " + strings.TrimSpace(fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

// fatalOf runs fn on its own goroutine with a fatalRecorder and returns what
// it passed to Fatalf, "" when it returned normally.
func fatalOf(t *testing.T, fn func(testing.TB)) string {
	f := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg
}

// TestMissingServicesFail checks the harness's promise: with the variables
// unset or pointing nowhere, the helpers fail the test with the hint on
// how to start the bed. They never skip and never hang.
func TestMissingServicesFail(t *testing.T) {
	cases := []struct {
		name string
		env  string
		val  string
		call func(testing.TB)
	}{
		{"kafka unset", "TIDEMARK_KAFKA_BROKERS", "", func(tb testing.TB) { bed.Kafka(tb) }},
		{"kafka unreachable", "TIDEMARK_KAFKA_BROKERS", "127.0.0.1:1", func(tb testing.TB) { bed.Kafka(tb) }},
		{"topic without kafka", "TIDEMARK_KAFKA_BROKERS", "", func(tb testing.TB) { bed.Topic(tb, 1) }},
		{"pg unset", "TIDEMARK_PG_DSN", "", func(tb testing.TB) { bed.PG(tb) }},
		{"pg unreachable", "TIDEMARK_PG_DSN", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", func(tb testing.TB) { bed.PG(tb) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.env, c.val)
			msg := fatalOf(t, c.call)
			if !strings.Contains(msg, bed.StartHint) {
				t.Fatalf("got %q, want a failure that says %q", msg, bed.StartHint)
			}
		})
	}
}

// TestBedAnswers is the positive case: with the bed up, the helpers return.
func TestBedAnswers(t *testing.T) {
	if msg := fatalOf(t, func(tb testing.TB) { bed.Kafka(tb) }); msg != "" {
		t.Fatal(msg)
	}
	if msg := fatalOf(t, func(tb testing.TB) { bed.PG(tb) }); msg != "" {
		t.Fatal(msg)
	}
}
