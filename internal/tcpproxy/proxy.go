// Package tcpproxy is a loopback TCP proxy for tests that need to cut, or
// slow down, a client's connections to a server they share with other
// tests (a Kafka broker of the test bed) without stopping that server.
//
// A Proxy listens on 127.0.0.1 and forwards every connection to one target
// address. Cut closes every forwarded connection and closes each new one as
// soon as it is accepted, until Restore; SetLatency delays every chunk of
// bytes, in both directions, by a fixed time. A client that learns other
// addresses from the server (Kafka's metadata names the brokers' advertised
// addresses) must be made to dial them through the proxy too, for example
// with a dialer that maps the target address to Addr.
package tcpproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from Addr to a target. Its methods are safe for
// concurrent use. Close stops it; a closed Proxy cannot be reused.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	cut     bool
	latency time.Duration
	conns   map[*pipe]struct{}
	closed  bool

	wg sync.WaitGroup // the accept loop and every pipe's goroutines
}

// New starts a proxy on a free loopback port that forwards to target
// (host:port). It fails if it cannot listen; the target is dialed only when
// a connection comes.
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, errors.New("tcpproxy: target " + target + " is not host:port: " + err.Error())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[*pipe]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut closes every forwarded connection and, until Restore, closes each new
// connection as soon as it is accepted: a client sees its connections
// reset and every dial end with nothing read.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[*pipe]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Restore undoes Cut: new connections are forwarded again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// SetLatency delays every chunk of bytes read from either side by d before
// it is written to the other, for connections made before and after; 0
// forwards at once. Throughput is not limited: chunks are queued.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to return.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// forward dials the target for client and copies both ways until either
// side ends or the pipe is closed.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		client.Close()
		return
	}
	pp := &pipe{a: client, b: server}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		pp.close()
		return
	}
	p.conns[pp] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.copy(server, client, pp) }()
	go func() { defer wg.Done(); p.copy(client, server, pp) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, pp)
	p.mu.Unlock()
}

// chunk is bytes read at a time, to be written once the latency passed.
type chunk struct {
	b  []byte
	at time.Time
}

// copy forwards from src to dst through a queue that delays each chunk by
// the latency, and closes the pipe when src ends or either side fails.
func (p *Proxy) copy(dst, src net.Conn, pp *pipe) {
	defer pp.close()
	q := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				pp.close()
				for range q { // let the reader finish
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			d := p.latency
			p.mu.Unlock()
			q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(d)}
		}
		if err != nil {
			// Either side ending ends the connection both ways (no
			// half-close: the clients this serves do not use it).
			close(q)
			<-done
			return
		}
	}
}

// pipe is one forwarded connection: the client's and the target's.
type pipe struct {
	a, b net.Conn
	once sync.Once
}

func (pp *pipe) close() {
	pp.once.Do(func() {
		pp.a.Close()
		pp.b.Close()
	})
}
