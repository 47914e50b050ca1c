package kafkago

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	kafka "github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Membership returns the member's view of the group (runner.Membership):
// the member id and generation of the generation kafka-go last gave it,
// and when a broker last answered on the consumer group's connections with
// the last error since. kafka-go has no hook for a request's answer, so the
// adapter watches those connections (through the Dialer's DialFunc): any
// bytes read on them count as an answer. They are the coordinator's
// connection, which carries the heartbeats, joins, syncs and commits, and
// the short-lived one kafka-go opens to any broker to find the coordinator,
// so a FindCoordinator answer counts too. A failed dial or read is
// recorded in ContactErr. kafka-go has no static membership: InstanceID is
// always "". It is safe to call at any time and does not block.
func (s *Source) Membership() runner.MemberInfo {
	info := runner.MemberInfo{Generation: runner.NoGeneration}
	s.member.mu.Lock()
	info.MemberID, info.Generation = s.member.id, s.member.gen
	info.ContactAt, info.ContactErr = s.member.at, s.member.err
	s.member.mu.Unlock()
	return info
}

var _ runner.Membership = (*Source)(nil)

// memberView is what Membership reports.
type memberView struct {
	mu  sync.Mutex
	id  string
	gen int32
	at  time.Time
	err string
}

func newMemberView() *memberView { return &memberView{gen: runner.NoGeneration} }

func (m *memberView) joined(kg *kafka.Generation) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.id, m.gen = kg.MemberID, kg.ID
}

func (m *memberView) answered() {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at, m.err = now, ""
}

func (m *memberView) failed(err error) {
	msg := err.Error() // net's and kafka-go's errors name addresses, never credentials
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = msg
}

// watchedDialer returns a copy of d whose connections report to m: a
// consumer group's connections. kafka-go applies TLS and SASL on top of
// what DialFunc returns, so the watched bytes are the raw ones; a read of
// any is an answer.
func watchedDialer(d *kafka.Dialer, m *memberView) *kafka.Dialer {
	w := *d
	dial := d.DialFunc
	if dial == nil {
		// kafka-go's own default when DialFunc is nil (Dialer.dialContext).
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, DualStack: d.DualStack, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	w.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			m.failed(err)
			return nil, err
		}
		return &watchedConn{Conn: c, m: m}, nil
	}
	return &w
}

// watchedConn reports its reads to a memberView.
type watchedConn struct {
	net.Conn
	m *memberView
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.m.answered()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		// A connection kafka-go closed itself is no failure; one the
		// broker ended or that timed out is.
		c.m.failed(err)
	}
	return n, err
}
