package tcpproxy_test

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/internal/tcpproxy"
)

// echo runs a loopback server that echoes each line, until the test ends.
func echo(t *testing.T) string {
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
				_, _ = io.Copy(c, c)
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
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "new"); err == nil {
		t.Fatalf("a connection made after Cut forwards: read %q", got)
	}
	p.Restore()
	c3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, "back"); err != nil || got != "back" {
		t.Fatalf("after Restore: %q, %v; want back", got, err)
	}
	c3.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
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
