package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestStartWaitsUnready: with PostgreSQL unreachable, the process does
// not exit: it serves /livez 200 and /readyz 503 naming what it waits
// for, and a SIGTERM ends the wait with exit 0. (It exited 1 at once,
// serving no probe.)
func TestStartWaitsUnready(t *testing.T) {
	httpAddr := closedAddr(t)
	t.Setenv("TIDEMARK_KAFKA_BROKERS", closedAddr(t))
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders@"+closedAddr(t)+"/orders?connect_timeout=1")
	cfg, err := parseConfig([]string{"-http", httpAddr}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	code := make(chan int, 1)
	go func() { code <- run(cfg, slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))) }()

	var ready string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case c := <-code:
			t.Fatalf("run returned %d while PostgreSQL was unreachable, serving no probe", c)
		default:
		}
		st, body, err := get("http://" + httpAddr + "/readyz")
		if err == nil && st == http.StatusServiceUnavailable && strings.Contains(body, "PostgreSQL") && strings.Contains(body, "connect") {
			ready = body
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %q %v; want 503 naming PostgreSQL and its connection error", st, body, err)
		}
	}
	if st, body, err := get("http://" + httpAddr + "/livez"); err != nil || st != http.StatusOK {
		t.Errorf("/livez while starting: %d %q %v, want 200", st, body, err)
	}
	if strings.Contains(ready, "password") {
		t.Errorf("/readyz quotes the DSN: %q", ready)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("run returned %d after SIGTERM while starting, want 0", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10s of SIGTERM while starting")
	}
	t.Logf("/readyz while starting: %s", strings.TrimSpace(ready))
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
