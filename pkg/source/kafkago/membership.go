package kafkago

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	kafka "github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/internal/kgocontact"
	"github.com/tidemark/tidemark/pkg/runner"
)

// Membership returns the member's view of the group (runner.Membership):
// the member id and generation of the generation kafka-go last gave it,
// and when the group's coordinator last served it, with the last error
// since. kafka-go has no hook for a request's answer, so the adapter
// watches the consumer group's connections (through the Dialer's
// DialFunc) and reads the Kafka frames on them: only an answer to a
// coordinator request (JoinGroup, SyncGroup, Heartbeat, OffsetCommit,
// OffsetFetch, LeaveGroup) counts, and only one without a group-level
// error (REBALANCE_IN_PROGRESS and MEMBER_ID_REQUIRED count: they are the
// coordinator running a rebalance). The FindCoordinator answer kafka-go
// gets from any broker before each join does not count, nor one that
// refuses the member (NOT_COORDINATOR, UNKNOWN_MEMBER_ID, an
// authorization failure...): that error is recorded in ContactErr, as is a
// failed dial or read. So while the coordinator cannot be reached or does
// not serve the member, ContactAt ages, however often kafka-go retries.
// kafka-go has no static membership: InstanceID is always "". It is safe
// to call at any time and does not block.
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
// consumer group's connections. The frames are read below SASL (kafka-go
// runs SASL as Kafka requests over the connection) but above TLS: when d
// has a TLS config the watched dial does the handshake itself, as kafka-go
// would (Dialer.dialContext), and the copy has none.
func watchedDialer(d *kafka.Dialer, m *memberView) *kafka.Dialer {
	w := *d
	w.TLS = nil
	dial := d.DialFunc
	if dial == nil {
		// kafka-go's own default when DialFunc is nil (Dialer.dialContext).
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, DualStack: d.DualStack, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	w.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err == nil && d.TLS != nil {
			c, err = handshake(ctx, c, d.TLS, address)
		}
		if err != nil {
			m.failed(err)
			return nil, err
		}
		return &watchedConn{Conn: kgocontact.WatchConn(c, m.answer), m: m}, nil
	}
	return &w
}

// handshake runs the TLS client handshake on c as kafka-go's Dialer does:
// the server name, if the config has none, is address's host.
func handshake(ctx context.Context, c net.Conn, cfg *tls.Config, address string) (net.Conn, error) {
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		host := address
		if i := strings.LastIndex(address, ":"); i >= 0 {
			host = address[:i]
		}
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// answer counts one answer to a coordinator request (kgocontact.WatchConn).
func (m *memberView) answer(a kgocontact.Answer) {
	if a.Refused() {
		m.failed(a.Err)
		return
	}
	m.answered()
}

// watchedConn reports its read errors to a memberView.
type watchedConn struct {
	net.Conn
	m *memberView
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		// A connection kafka-go closed itself is no failure; one the
		// broker ended or that timed out is.
		c.m.failed(err)
	}
	return n, err
}
