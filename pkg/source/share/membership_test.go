package share_test

import (
	"context"
	"crypto/tls"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// waitReady polls probes until Ready is want or the wait runs out.
func waitReady(t *testing.T, probes *shutdown.Probes, r *runner.Runner, want bool, within time.Duration, what string) {
	t.Helper()
	var why string
	for start := time.Now(); time.Since(start) < within; time.Sleep(20 * time.Millisecond) {
		var ok bool
		if ok, why = probes.Ready(); ok == want {
			return
		}
	}
	m := r.Stats().Member
	t.Fatalf("%s: ready is not %v after %v (%q): joined %v, contact %v, err %q", what, want, within, why, m.Joined, m.ContactAt, m.ContactErr)
}

// TestShareFencedLeavesAndRejoins: a session whose heartbeat is refused
// FENCED_MEMBER_EPOCH is out of the group: the source reports the loss of
// membership, and readiness fails at once (not after the contact limit);
// when heartbeats are served again it reports the member joined again.
func TestShareFencedLeavesAndRejoins(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var fence atomic.Bool
	c.ControlKey(int16(kmsg.ShareGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !fence.Load() {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
		resp.SetVersion(req.GetVersion())
		resp.ErrorCode = kerr.FencedMemberEpoch.Code
		return resp, nil, true
	})
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }), runner.Failure(runner.Skip(1)))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-errc
	})
	// A limit far above the test's waits: only the membership can fail
	// readiness here.
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(time.Hour))
	probes.Started()
	waitReady(t, probes, r, true, 10*time.Second, "heartbeats served")
	fence.Store(true)
	waitReady(t, probes, r, false, 10*time.Second, "heartbeats refused FENCED_MEMBER_EPOCH")
	if m := r.Stats().Member; m.Joined || m.Rebalances[len(m.Rebalances)-1].Kind != "lost" {
		t.Fatalf("fenced: joined %v, last report %+v; want not joined after a loss", m.Joined, m.Rebalances[len(m.Rebalances)-1])
	}
	fence.Store(false)
	waitReady(t, probes, r, true, 10*time.Second, "heartbeats served again")
}

// TestShareTLSContact: with TLS (kgo.DialTLSConfig), the answers are still
// read, above TLS: the member becomes ready.
func TestShareTLSContact(t *testing.T) {
	t.Parallel()
	cert, pool := kafkatest.SelfSigned(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1),
		share.ClientOptions(kgo.DialTLSConfig(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(src, runner.Handle("t", func(context.Context, runner.Record) error { return nil }), runner.Failure(runner.Skip(1)))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
		<-errc
	})
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(time.Hour))
	probes.Started()
	waitReady(t, probes, r, true, 10*time.Second, "over TLS")
}
