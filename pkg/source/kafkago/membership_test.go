package kafkago_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// startMember runs a runner over a kafka-go source of group g on brokers
// and returns it with its probes (contact limit limit), once ready.
func startMember(t *testing.T, brokers []string, limit time.Duration, opts ...kafkago.Option) (*runner.Runner, *shutdown.Probes) {
	t.Helper()
	src, err := kafkago.New(brokers, "g", []string{"t"}, append([]kafkago.Option{
		kafkago.SessionTimeout(2 * time.Second), kafkago.RebalanceTimeout(3 * time.Second),
		kafkago.HeartbeatInterval(100 * time.Millisecond), kafkago.JoinGroupBackoff(200 * time.Millisecond),
		kafkago.MaxWait(100 * time.Millisecond), kafkago.Logger(kafkatest.Logger(t)),
	}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(20*time.Millisecond), runner.DrainBudget(time.Second))
	if err != nil {
		t.Fatalf("runner.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-done
	})
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(limit))
	probes.Started()
	kafkatest.WaitFor(t, 15*time.Second, "ready, owning partitions", func() bool {
		ok, _ := probes.Ready()
		return ok && len(r.Stats().Partitions) > 0
	})
	return r, probes
}

// TestReadinessCoordinatorRefuses: the coordinator answers every group
// request, but refuses the member: NOT_COORDINATOR (kafka-go then finds
// the coordinator again, and the broker names the same one), or
// GROUP_AUTHORIZATION_FAILED (its ACL removed). Those answers are no
// contact: readiness fails within the contact limit, and the refusal is
// the recorded error.
func TestReadinessCoordinatorRefuses(t *testing.T) {
	t.Parallel()
	for _, refusal := range []*kerr.Error{kerr.NotCoordinator, kerr.GroupAuthorizationFailed} {
		t.Run(refusal.Message, func(t *testing.T) { testRefused(t, refusal) })
	}
}

func testRefused(t *testing.T, refusal *kerr.Error) {
	c := kafkatest.NewFake(t, kfake.SeedTopics(1, "t"))
	const limit = 2 * time.Second
	r, probes := startMember(t, c.Brokers(), limit)
	refuse := c.RefuseGroup(refusal.Code)
	refuse.Store(true)
	cut := time.Now()
	for time.Since(cut) < 3*limit {
		if ok, why := probes.Ready(); !ok {
			if m := r.Stats().Member; !strings.Contains(m.ContactErr, refusal.Message) {
				t.Errorf("unready (%q) but the recorded error is %q, want the refusal", why, m.ContactErr)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := r.Stats().Member
	t.Fatalf("still ready %v after the coordinator began refusing the member (contact limit %v): joined %v, contact %v ago, err %q",
		time.Since(cut).Round(time.Millisecond), limit, m.Joined, time.Since(m.ContactAt).Round(time.Millisecond), m.ContactErr)
}

// TestReadinessRebalanceCounts: a second member joining runs a rebalance
// (the first member's generation ends, it rejoins and syncs): the first
// member stays ready through it and its contact is still counted after
// (the frames stay paired across the rebalance's requests). That
// REBALANCE_IN_PROGRESS itself is no refusal is TestWatchConn's.
func TestReadinessRebalanceCounts(t *testing.T) {
	t.Parallel()
	c := kafkatest.NewFake(t, kfake.SeedTopics(2, "t"))
	r, probes := startMember(t, c.Brokers(), 2*time.Second)
	before := time.Now()
	src2, err := kafkago.New(c.Brokers(), "g", []string{"t"},
		kafkago.SessionTimeout(2*time.Second), kafkago.RebalanceTimeout(3*time.Second),
		kafkago.HeartbeatInterval(100*time.Millisecond), kafkago.MaxWait(100*time.Millisecond), kafkago.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := runner.New(src2, runner.Handle("t", func(context.Context, runner.Record) error { return nil }), runner.Logger(kafkatest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r2.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r2.Shutdown(ctx)
		<-done
	})
	kafkatest.WaitFor(t, 15*time.Second, "the partitions shared by the two members", func() bool {
		if ok, why := probes.Ready(); !ok {
			t.Fatalf("first member unready during the rebalance: %s", why)
		}
		return len(r.Stats().Partitions) == 1 && len(r2.Stats().Partitions) == 1
	})
	if m := r.Stats().Member; !m.ContactAt.After(before) {
		t.Fatalf("no contact counted during the rebalance (last %v, began %v)", m.ContactAt, before)
	}
}

// TestReadinessTLS: with TLS on the Dialer, the frames are still read
// (above TLS, the watched dial doing the handshake): ready, with contact.
func TestReadinessTLS(t *testing.T) {
	t.Parallel()
	cert, pool := kafkatest.SelfSigned(t)
	fc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fc.Close)
	r, _ := startMember(t, fc.ListenAddrs(), time.Hour,
		kafkago.Dialer(&kafka.Dialer{Timeout: 10 * time.Second, TLS: &tls.Config{RootCAs: pool}}))
	if m := r.Stats().Member; m.ContactAt.IsZero() {
		t.Fatalf("ready over TLS with no contact counted: err %q", m.ContactErr)
	}
}
