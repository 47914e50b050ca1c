package tcpproxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/tcpproxy"
)

// echo runs a loopback server that echoes each line, until the test ends.
func echo(t *testing.T) string {
	return serve(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// serve runs a loopback server that hands each connection to handle, until
// the test ends (the connections are closed then).
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends a line over c and reads it back.
func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestForwardCutRestore(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { // registered first: runs after the server and proxy are gone
		if err := goleak.Find(opt); err != nil {
			t.Errorf("goroutines outlived the proxy: %v", err)
		}
	})
	p := newProxy(t, echo(t))
	c := dial(t, p.Addr())
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
		t.Fatalf("through the proxy: %q, %v; want hello", got, err)
	}
	p.Cut()
	if got, err := roundTrip(c, "after the cut"); err == nil {
		t.Fatalf("a connection made before Cut still forwards: read %q", got)
	}
	if c2, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c2.Close()
		t.Fatal("a dial after Cut was accepted, want it refused")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a dial after Cut failed with %v, want ECONNREFUSED", err)
	}
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	c3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, "back"); err != nil || got != "back" {
		t.Fatalf("after Restore: %q, %v; want back", got, err)
	}
	c3.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restore(); err == nil {
		t.Fatal("Restore after Close succeeded")
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("the proxy still accepts after Close")
	}
}

func TestLatency(t *testing.T) {
	p := newProxy(t, echo(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	const d = 150 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if got, err := roundTrip(c, "slow"); err != nil || got != "slow" {
		t.Fatalf("with latency: %q, %v", got, err)
	}
	// Each direction is delayed by d: the round trip takes at least 2d.
	if took := time.Since(start); took < 2*d {
		t.Fatalf("round trip took %v with latency %v each way, want at least %v", took, d, 2*d)
	}
	p.SetLatency(0)
	start = time.Now()
	if _, err := roundTrip(c, "fast"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= d {
		t.Fatalf("round trip took %v after SetLatency(0), want under %v", took, d)
	}
}

func TestBadTarget(t *testing.T) {
	if _, err := tcpproxy.New("no-port"); err == nil {
		t.Fatal("New accepted a target without a port")
	}
}

// stamper runs a loopback server that answers each line with the time it
// read it (UnixNano), until the test ends.
func stamper(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			if _, err := fmt.Fprintf(c, "%d\n", time.Now().UnixNano()); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

func TestLatencyPerDirection(t *testing.T) {
	p := newProxy(t, stamper(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	const d = 150 * time.Millisecond
	for _, tc := range []struct {
		name          string
		toTarget, toC time.Duration
	}{{"to the target", d, 0}, {"to the client", 0, d}} {
		p.SetLatencies(tc.toTarget, tc.toC)
		sent := time.Now()
		got, err := roundTrip(c, "when")
		back := time.Now()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		ns, err := strconv.ParseInt(got, 10, 64)
		if err != nil {
			t.Fatalf("%s: the server answered %q", tc.name, got)
		}
		read := time.Unix(0, ns)
		if up := read.Sub(sent); up < tc.toTarget {
			t.Errorf("%s: the line reached the target %v after it was sent, want at least %v", tc.name, up, tc.toTarget)
		}
		if down := back.Sub(read); down < tc.toC {
			t.Errorf("%s: the answer reached the client %v after the target read the line, want at least %v", tc.name, down, tc.toC)
		}
	}
}

func TestBlackhole(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(opt); err != nil {
			t.Errorf("goroutines outlived the proxy: %v", err)
		}
	})
	p := newProxy(t, echo(t))
	before := dial(t, p.Addr())
	if _, err := roundTrip(before, "warm"); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	// A partition: the old connection is open but unanswered, and a new
	// dial is accepted (not refused) and unanswered too.
	before.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := io.WriteString(before, "held\n"); err != nil {
		t.Fatalf("writing over the blackhole: %v, want the write taken", err)
	}
	rb := bufio.NewReader(before)
	if got, err := rb.ReadString('\n'); err == nil || !isTimeout(err) {
		t.Fatalf("over the blackhole the old connection read %q, %v; want a timeout", got, err)
	}
	after, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("a dial to a blackholed proxy failed (%v): want it accepted, as over a partition", err)
	}
	defer after.Close()
	after.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := io.WriteString(after, "new\n"); err != nil {
		t.Fatal(err)
	}
	ra := bufio.NewReader(after)
	if got, err := ra.ReadString('\n'); err == nil || !isTimeout(err) {
		t.Fatalf("over the blackhole a new connection read %q, %v; want a timeout", got, err)
	}
	// Healed: the held bytes go through on both connections.
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r    *bufio.Reader
		c    net.Conn
		want string
	}{{rb, before, "held\n"}, {ra, after, "new\n"}} {
		tc.c.SetDeadline(time.Now().Add(5 * time.Second))
		if got, err := tc.r.ReadString('\n'); err != nil || got != tc.want {
			t.Fatalf("after Restore: read %q, %v; want the held %q", got, err, tc.want)
		}
	}
	// Cut and Close end a blackhole's held connections too.
	p.Blackhole()
	held := dial(t, p.Addr())
	p.Cut()
	held.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a connection held by a blackhole survived Cut: read %v", err)
	}
	before.Close()
	after.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestReset(t *testing.T) {
	p := newProxy(t, echo(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset aborted %d connections, want 1", n)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after Reset the client read %v, want ECONNRESET (a RST, not a FIN)", err)
	}
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "again"); err != nil || got != "again" {
		t.Fatalf("a dial after Reset: %q, %v; want it forwarded", got, err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("the second Reset aborted %d connections, want 1 (the first one's are gone)", n)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// echoBut runs a loopback server that echoes each line but "boom", which it
// never answers (so that a reset after it cannot race its answer), until
// the test ends.
func echoBut(t *testing.T) string {
	return serve(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if line != "boom\n" {
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		}
	})
}

func TestResetAfter(t *testing.T) {
	p := newProxy(t, echoBut(t))
	c := dial(t, p.Addr())
	var mu sync.Mutex
	var seen []string
	p.ResetAfter(func(toTarget bool, b []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%v %q", toTarget, b))
		return toTarget && string(b) == "boom\n"
	})
	if got, err := roundTrip(c, "fine"); err != nil || got != "fine" {
		t.Fatalf("a chunk that does not match: %q, %v; want it forwarded", got, err)
	}
	if _, err := roundTrip(c, "boom"); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after a matching chunk the client got %v, want ECONNRESET", err)
	}
	mu.Lock()
	want := []string{`true "fine\n"`, `false "fine\n"`, `true "boom\n"`}
	if !slices.Equal(seen, want) {
		t.Errorf("match saw %v, want %v", seen, want)
	}
	mu.Unlock()
	p.ResetAfter(nil)
	c2 := dial(t, p.Addr())
	if _, err := io.WriteString(c2, "boom\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c2, "fine"); err != nil || got != "fine" {
		t.Fatalf("after ResetAfter(nil): %q, %v; want the connection alive", got, err)
	}
}

// countingConn counts the bytes written to it and read from it: a write
// before it goes out (the echo may answer before Write returns), a read
// before the proxy passes it on.
type countingConn struct {
	net.Conn
	wrote, read *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.wrote.Add(int64(len(b)))
	return c.Conn.Write(b)
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

func TestWrapTarget(t *testing.T) {
	p := newProxy(t, echo(t))
	var wrote, read atomic.Int64
	var wrapped atomic.Int64
	p.WrapTarget(func(c net.Conn) net.Conn {
		wrapped.Add(1)
		return countingConn{Conn: c, wrote: &wrote, read: &read}
	})
	c := dial(t, p.Addr())
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if wrapped.Load() != 1 || wrote.Load() != 6 || read.Load() != 6 {
		t.Fatalf("wrapped %d connections, %d bytes written to the target and %d read, want 1, 6 and 6",
			wrapped.Load(), wrote.Load(), read.Load())
	}
	// Reset still reaches the connection under the wrapper.
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset = %d connections, want 1", n)
	}
	if _, err := roundTrip(c, "again"); err == nil {
		t.Fatal("the client's connection still works after Reset")
	}
}
