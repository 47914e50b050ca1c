//go:build integration

package integration_test

// Readiness against the real broker: what the runner reports of its
// membership (Stats.Member) and what shutdown.Probes makes of it.

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/internal/tcpproxy"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// runPlain runs a runner over src (no spy: the spy would hide the source's
// Membership) with a no-op handler for topic, shut down in the test's
// cleanup within 20s.
func runPlain(t *testing.T, src runner.Source, topic string, opts ...runner.Option) *runner.Runner {
	t.Helper()
	r, err := runner.New(src, append([]runner.Option{runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
		runner.Logger(kafkatest.Logger(t)), runner.DrainBudget(5 * time.Second)}, opts...)...)
	if err != nil {
		src.Close()
		t.Fatalf("runner.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// TestIdleMemberJoined: in a group with more members than partitions, the
// member that gets nothing is still reported joined (Stats.Member.Joined),
// with a member id, a generation and a contact: franz under the classic
// protocol (cooperative and eager) and KIP-848, and kafkago.
func TestIdleMemberJoined(t *testing.T) {
	t.Parallel()
	franzWith := func(opts ...franz.Option) func(t *testing.T, group, topic string) runner.Source {
		return func(t *testing.T, group, topic string) runner.Source { return franzSource(t, group, topic, opts...) }
	}
	cases := []struct {
		name string
		src  func(t *testing.T, group, topic string) runner.Source
	}{
		{"cooperative", franzWith()},
		{"eager", franzWith(franz.Eager())},
		{"kip848", franzWith(franz.ServerSideAssignment())},
		{"kafkago", func(t *testing.T, group, topic string) runner.Source {
			src, err := kafkago.New(bed.Kafka(t), group, []string{topic}, kafkago.SessionTimeout(6*time.Second),
				kafkago.RebalanceTimeout(10*time.Second), kafkago.HeartbeatInterval(500*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)))
			if err != nil {
				t.Fatalf("kafkago.New: %v", err)
			}
			return src
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			topic, group := bed.Topic(t, 1), bed.Group(t)
			a := runPlain(t, tc.src(t, group, topic), topic)
			kafkatest.WaitFor(t, 30*time.Second, "the first member owns the partition", func() bool { return len(a.Stats().Partitions) == 1 })
			b := runPlain(t, tc.src(t, group, topic), topic)
			kafkatest.WaitFor(t, 30*time.Second, "both members joined, one of them owning the partition", func() bool {
				sa, sb := a.Stats(), b.Stats()
				return sa.Member.Joined && sb.Member.Joined && len(sa.Partitions)+len(sb.Partitions) == 1
			})
			idle := b
			if len(b.Stats().Partitions) == 1 {
				idle = a
			}
			m := idle.Stats().Member
			if m.Group != group || m.MemberID == "" || m.Generation < 0 || m.ContactAt.IsZero() || len(m.Rebalances) == 0 {
				t.Fatalf("the idle member's Stats.Member = %+v, want group %s, a member id, a generation, a contact and its rebalances", m, group)
			}
			probes := shutdown.NewProbes(idle, 10*time.Second)
			probes.Started()
			if ok, why := probes.Ready(); !ok {
				t.Fatalf("the idle member is not ready: %s", why)
			}
		})
	}
}

// proxied returns a proxy to the bed's broker and franz options that send
// every connection of the client through it: the seed, and (through the
// dialer) the address the broker advertises in its metadata, which the
// client would otherwise dial directly after the first answer. The bed has
// one broker, so every address maps to the one proxy.
func proxied(t *testing.T) (*tcpproxy.Proxy, []franz.Option) {
	t.Helper()
	brokers := bed.Kafka(t)
	if len(brokers) != 1 {
		t.Fatalf("the readiness tests proxy a single broker; TIDEMARK_KAFKA_BROKERS has %d", len(brokers))
	}
	p, err := tcpproxy.New(brokers[0])
	if err != nil {
		t.Fatalf("tcpproxy.New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	var d net.Dialer
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, p.Addr())
	}
	return p, []franz.Option{franz.ClientOptions(kgo.SeedBrokers(p.Addr()), kgo.Dialer(dial))}
}

// readyMember is a runner over a franz source whose connections go through
// its own proxy, with probes.
type readyMember struct {
	proxy  *tcpproxy.Proxy
	r      *runner.Runner
	probes *shutdown.Probes
}

// The timeouts of the proxied members: a 6s session, heartbeats every
// 500ms, and a contact limit of 4s (the probes' threshold under test).
const (
	readySession = 6 * time.Second
	readyLimit   = 4 * time.Second
)

func startReadyMember(t *testing.T, group, topic string) *readyMember {
	t.Helper()
	p, opts := proxied(t)
	src := franzSource(t, group, topic, append(opts, franz.SessionTimeout(readySession), franz.RebalanceTimeout(readySession))...)
	r := runPlain(t, src, topic)
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(readyLimit))
	probes.Started()
	return &readyMember{proxy: p, r: r, probes: probes}
}

func (m *readyMember) ready() bool { ok, _ := m.probes.Ready(); return ok }

// cutAndRestore cuts m's connections and checks that m goes unready within
// the contact limit (and a heartbeat), stays live while cut, and is ready
// again after the connections are restored. It returns how long each took.
func cutAndRestore(t *testing.T, m *readyMember) (unready, ready time.Duration) {
	t.Helper()
	m.proxy.Cut()
	cut := time.Now()
	var why string
	for {
		ok, w := m.probes.Ready()
		if !ok {
			why = w
			break
		}
		if live, lw := m.probes.Live(); !live {
			t.Fatalf("liveness failed during the outage: %s", lw)
		}
		if time.Since(cut) > readyLimit+2*time.Second {
			t.Fatalf("still ready %v after the broker was cut off (contact limit %v)", time.Since(cut), readyLimit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	unready = time.Since(cut)
	t.Logf("not ready %v after the cut: %s", unready.Round(time.Millisecond), why)
	// Stay cut past the session timeout: the coordinator evicts the
	// member, which must rejoin.
	deadline := time.Now().Add(readySession + time.Second)
	for time.Now().Before(deadline) {
		if ok, w := m.probes.Ready(); ok {
			t.Fatalf("ready again while cut off: %s", w)
		}
		if live, lw := m.probes.Live(); !live {
			t.Fatalf("liveness failed during the outage: %s", lw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := m.proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	kafkatest.WaitFor(t, 60*time.Second, "ready again after the broker came back", m.ready)
	ready = time.Since(restored)
	t.Logf("ready again %v after the restore", ready.Round(time.Millisecond))
	return unready, ready
}

// TestReadinessFollowsTheBroker: a member that owns partitions goes
// unready within the contact limit once its connections to the broker are
// cut (the shared broker keeps running: a proxy is cut), liveness stays
// true throughout, and it is ready again once they are restored.
func TestReadinessFollowsTheBroker(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	topic, group := bed.Topic(t, 2), bed.Group(t)
	m := startReadyMember(t, group, topic)
	kafkatest.WaitFor(t, 30*time.Second, "ready and owning both partitions", func() bool { return m.ready() && len(m.r.Stats().Partitions) == 2 })
	cutAndRestore(t, m)
	kafkatest.WaitFor(t, 30*time.Second, "the partitions owned again", func() bool { return len(m.r.Stats().Partitions) == 2 })
}

// TestReadinessIdleMember: in a group with more members than partitions
// the member that owns nothing is ready, goes unready when its own
// connections are cut while the other stays ready, and is ready again
// after the restore.
func TestReadinessIdleMember(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	topic, group := bed.Topic(t, 1), bed.Group(t)
	a := startReadyMember(t, group, topic)
	kafkatest.WaitFor(t, 30*time.Second, "the first member ready", a.ready)
	b := startReadyMember(t, group, topic)
	kafkatest.WaitFor(t, 30*time.Second, "both members ready", func() bool { return a.ready() && b.ready() })
	idle, busy := b, a
	if len(b.r.Stats().Partitions) == 1 {
		idle, busy = a, b
	}
	if n := len(idle.r.Stats().Partitions); n != 0 {
		t.Fatalf("the idle member owns %d partitions", n)
	}
	cutAndRestore(t, idle)
	if ok, why := busy.probes.Ready(); !ok {
		t.Fatalf("the member whose connections were not cut is not ready: %s", why)
	}
}

// TestReadinessWrongBrokerAddress: a runner pointed at a port nothing
// listens on is never ready, and says why (franz and kafkago).
func TestReadinessWrongBrokerAddress(t *testing.T) {
	t.Parallel()
	const name = "readiness-wrong-address"
	cases := []struct {
		name string
		src  func(t *testing.T, addr string) (runner.Source, error)
	}{
		{"franz", func(t *testing.T, addr string) (runner.Source, error) {
			return franz.New([]string{addr}, name, []string{name}, franz.Logger(kafkatest.Logger(t)),
				franz.SessionTimeout(6*time.Second), franz.HeartbeatInterval(500*time.Millisecond))
		}},
		{"kafkago", func(t *testing.T, addr string) (runner.Source, error) {
			return kafkago.New([]string{addr}, name, []string{name}, kafkago.Logger(kafkatest.Logger(t)),
				kafkago.SessionTimeout(6*time.Second), kafkago.HeartbeatInterval(500*time.Millisecond))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close() // nothing listens there now
			src, err := tc.src(t, addr)
			if err != nil {
				t.Fatal(err)
			}
			r := runPlain(t, src, name)
			probes := shutdown.NewProbes(r, 10*time.Second)
			probes.Started()
			kafkatest.WaitFor(t, 20*time.Second, "the source reports the failed dial", func() bool {
				return strings.Contains(r.Stats().Member.ContactErr, "refused")
			})
			ok, why := probes.Ready()
			if ok || !strings.Contains(why, "no answer from the group coordinator yet") || !strings.Contains(why, addr) {
				t.Fatalf("Ready = %v %q, want false, naming no answer yet and the dial to %s", ok, why, addr)
			}
			t.Logf("readiness with a wrong broker address: %s", why)
			if live, lw := probes.Live(); !live {
				t.Fatalf("liveness failed with a wrong broker address: %s", lw)
			}
		})
	}
}

// TestReadinessShareIdle: a share-group member on a topic with no records
// (so no partition is ever reported to the runner) is ready once each of
// its sessions was answered a heartbeat.
func TestReadinessShareIdle(t *testing.T) {
	t.Parallel()
	noLeaks(t)
	shareBedFeature(t)
	topic, group := bed.Topic(t, 2), bed.Group(t)
	r := runPlain(t, newShareSource(t, group, topic, share.Sessions(2)), topic, runner.Failure(runner.Skip(3)))
	probes := shutdown.NewProbes(r, 10*time.Second)
	probes.Started()
	kafkatest.WaitFor(t, 30*time.Second, "the idle share member ready", func() bool { ok, _ := probes.Ready(); return ok })
	m := r.Stats().Member
	if !m.Joined || m.ContactAt.IsZero() || len(r.Stats().Partitions) != 0 {
		t.Fatalf("Stats.Member = %+v with %d partitions, want joined, a contact, no partition", m, len(r.Stats().Partitions))
	}
}
