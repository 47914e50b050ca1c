// Package tcpproxy is a loopback TCP proxy for tests that need to cut, hold,
// reset or slow down a client's connections to a server they share with
// other tests (a Kafka broker or the PostgreSQL of the test bed) without
// stopping that server.
//
// A Proxy listens on 127.0.0.1 and forwards every connection to one target
// address. Its faults:
//
//   - Cut closes every forwarded connection and stops listening, so a dial
//     is refused as by a stopped server, until Restore listens again on the
//     same port.
//   - Blackhole is a network partition: connections stay open and new ones
//     are accepted, but no byte goes through either way until Restore,
//     which lets the held bytes through (as TCP does when a partition
//     heals: a connection its client has not given up on resumes).
//   - Reset aborts every live connection with a TCP RST to both sides, as a
//     middlebox or a crashed peer does; new connections are forwarded.
//     ResetAfter does it to one connection right after it carried bytes
//     that a test recognises (a given request of a protocol, say).
//   - SetLatency and SetLatencies delay every chunk of bytes, per direction.
//
// A client that learns other addresses from the server (Kafka's metadata
// names the brokers' advertised addresses) must be made to dial them through
// the proxy too, for example with a dialer that maps the target address to
// Addr.
package tcpproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from Addr to a target. Its methods are safe for
// concurrent use. Close stops it; a closed Proxy cannot be reused.
type Proxy struct {
	target string
	addr   string

	lnMu sync.Mutex   // serializes Cut, Restore and Close
	ln   net.Listener // nil while cut

	mu       sync.Mutex
	cut      bool
	held     chan struct{} // non-nil while blackholed; closed by Restore
	up, down time.Duration // latency towards the target, towards the client
	resetOn  func(toTarget bool, b []byte) bool
	wrap     func(net.Conn) net.Conn
	conns    map[*pipe]struct{}
	closed   bool

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
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[*pipe]struct{}{}}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port). It stays the same across
// Cut and Restore.
func (p *Proxy) Addr() string { return p.addr }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut closes every forwarded connection and stops listening: until
// Restore, a dial to Addr is refused (ECONNREFUSED), as when the server is
// down. It ends a Blackhole (the held connections are closed).
func (p *Proxy) Cut() {
	p.lnMu.Lock()
	defer p.lnMu.Unlock()
	p.cutLocked()
}

func (p *Proxy) cutLocked() {
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[*pipe]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Blackhole stops every byte, both ways, on the connections made before
// and after, until Restore: a partition, not a refusal. A dial to Addr
// still succeeds (the proxy accepts it) but the target is not dialed until
// Restore; a client sees its requests go unanswered until its own timeouts
// give up. Bytes read before the call may still be written. It does nothing
// while cut.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil && !p.cut && !p.closed {
		p.held = make(chan struct{})
	}
}

// Reset aborts every live connection with a TCP RST to the client and to
// the target (SO_LINGER 0, then close) and returns how many it aborted. It
// does not stop the proxy: new connections are forwarded (or held, while
// blackholed).
func (p *Proxy) Reset() int {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[*pipe]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.reset()
	}
	return len(conns)
}

// ResetAfter makes the proxy call match with each chunk of bytes it
// forwards (toTarget: sent by the client) and, when match returns true,
// reset the chunk's connection (as Reset does) right after the chunk went
// out: a test can abort a connection right after a given request reached
// the server, before its answer. A chunk is what one read returned,
// usually one write of the sender's. match is called from the proxy's
// goroutines, concurrently, but before its chunk is written, so a chunk
// that answers another is matched after it. nil removes it.
func (p *Proxy) ResetAfter(match func(toTarget bool, b []byte) bool) {
	p.mu.Lock()
	p.resetOn = match
	p.mu.Unlock()
}

// ErrClosed is Restore's error after Close.
var ErrClosed = errors.New("tcpproxy: Restore after Close")

// Restore undoes Cut and Blackhole: it listens on Addr again and forwards
// new connections, and lets the held bytes of a blackhole through. It fails
// if the port was taken meanwhile, or after Close.
func (p *Proxy) Restore() error {
	p.lnMu.Lock()
	defer p.lnMu.Unlock()
	p.mu.Lock()
	closed := p.closed
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if p.ln != nil {
		return nil // not cut
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("tcpproxy: listening on %s again: %w", p.addr, err)
	}
	p.ln = ln
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

// WrapTarget makes the proxy copy through wrap(conn) for each connection to
// the target it dials from now on: wrap sees the client's bytes written to
// the target and the target's read back (a watcher of the protocol, such as
// kgocontact.WatchConn). Cut, Reset and Close still act on the connection
// itself.
func (p *Proxy) WrapTarget(wrap func(net.Conn) net.Conn) {
	p.mu.Lock()
	p.wrap = wrap
	p.mu.Unlock()
}

// SetLatency delays every chunk of bytes read from either side by d before
// it is written to the other, for connections made before and after; 0
// forwards at once. Throughput is not limited: chunks are queued.
func (p *Proxy) SetLatency(d time.Duration) { p.SetLatencies(d, d) }

// SetLatencies is SetLatency per direction: toTarget delays the bytes the
// client sends, toClient those the target answers.
func (p *Proxy) SetLatencies(toTarget, toClient time.Duration) {
	p.mu.Lock()
	p.up, p.down = max(toTarget, 0), max(toClient, 0)
	p.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to return.
func (p *Proxy) Close() error {
	p.lnMu.Lock()
	p.mu.Lock()
	p.closed = true
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
	p.mu.Unlock()
	p.cutLocked()
	p.lnMu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed: Cut or Close
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// pass blocks while the proxy is blackholed, and returns false if pp was
// closed meanwhile.
func (p *Proxy) pass(pp *pipe) bool {
	for {
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if held == nil {
			return !pp.isClosed()
		}
		select {
		case <-held:
		case <-pp.done:
			return false
		}
	}
}

// forward dials the target for client (once no blackhole holds it) and
// copies both ways until either side ends or the pipe is closed.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	pp := &pipe{a: client, done: make(chan struct{})}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		pp.close()
		return
	}
	p.conns[pp] = struct{}{} // so that Cut, Reset and Close reach a held dial
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pp)
		p.mu.Unlock()
	}()
	if !p.pass(pp) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		pp.close()
		return
	}
	if !pp.setTarget(server) {
		return // closed while dialing
	}
	p.mu.Lock()
	wrap := p.wrap
	p.mu.Unlock()
	through := server
	if wrap != nil {
		through = wrap(server)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.copy(through, client, pp, true) }()
	go func() { defer wg.Done(); p.copy(client, through, pp, false) }()
	wg.Wait()
}

// chunk is bytes read at a time, to be written once the latency passed.
type chunk struct {
	b  []byte
	at time.Time
}

// copy forwards from src to dst through a queue that delays each chunk by
// the latency of its direction (up: towards the target), holds it while
// blackholed, and closes the pipe when src ends or either side fails.
func (p *Proxy) copy(dst, src net.Conn, pp *pipe, up bool) {
	defer pp.close()
	q := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if !p.pass(pp) {
				for range q { // let the reader finish
				}
				return
			}
			// match sees the chunk before it goes out, so the calls for
			// chunks that caused one another (a request, then its answer)
			// come in that order; the reset still follows the write.
			p.mu.Lock()
			match := p.resetOn
			p.mu.Unlock()
			matched := match != nil && match(up, c.b)
			if _, err := dst.Write(c.b); err != nil {
				pp.close()
				for range q {
				}
				return
			}
			if matched {
				p.mu.Lock()
				delete(p.conns, pp)
				p.mu.Unlock()
				pp.reset()
				for range q {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// Held here while blackholed: src is not read, so its sender's
			// buffers fill as over a partition.
			if !p.pass(pp) {
				err = net.ErrClosed
			} else {
				p.mu.Lock()
				d := p.down
				if up {
					d = p.up
				}
				p.mu.Unlock()
				q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(d)}
			}
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

// pipe is one forwarded connection: the client's (a) and the target's (b,
// nil until dialed).
type pipe struct {
	a    net.Conn
	done chan struct{} // closed by close

	mu     sync.Mutex
	b      net.Conn
	closed bool
}

// setTarget attaches the target's connection, or closes it and returns
// false if the pipe was closed meanwhile.
func (pp *pipe) setTarget(b net.Conn) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.closed {
		b.Close()
		return false
	}
	pp.b = b
	return true
}

func (pp *pipe) isClosed() bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.closed
}

func (pp *pipe) close() { pp.end(false) }

// reset closes both connections with SO_LINGER 0, which makes the kernel
// send a RST instead of a FIN.
func (pp *pipe) reset() { pp.end(true) }

func (pp *pipe) end(rst bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.closed {
		return
	}
	pp.closed = true
	close(pp.done)
	for _, c := range []net.Conn{pp.a, pp.b} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}
