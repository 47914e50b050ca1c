//go:build integration

package integration_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// netSwitch is a dial function (a franz-go kgo.Dialer, a pgx DialFunc)
// whose connections can be cut, as if the host were partitioned away from
// the server: refuse fails new dials, cut also closes every open
// connection, restore lets dials through again. The zero netSwitch lets
// dials through; its methods are safe for concurrent use. No lock is held
// while a dial waits for the network.
type netSwitch struct {
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

var errCut = errors.New("test: network cut")

func (s *netSwitch) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return nil, errCut
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down { // cut while dialing
		c.Close()
		return nil, errCut
	}
	if s.conns == nil {
		s.conns = map[net.Conn]bool{}
	}
	s.conns[c] = true
	return c, nil
}

func (s *netSwitch) refuse() {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
}

func (s *netSwitch) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = true
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
}

func (s *netSwitch) restore() {
	s.mu.Lock()
	s.down = false
	s.mu.Unlock()
}
