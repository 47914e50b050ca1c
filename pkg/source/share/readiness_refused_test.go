package share_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// TestShareRefusedIsNotReady: the coordinator refuses every
// ShareGroupHeartbeat (GROUP_AUTHORIZATION_FAILED: a missing ACL, the
// share-group twin of a wrong broker address). The member is never in
// the group and never gets a record, so it must never be ready. The
// source counts the refusal as the coordinator's answer ("whatever its
// error code"), reports itself joined at the first one, and the contact
// stays fresh: ready, with every heartbeat refused.
func TestShareRefusedIsNotReady(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.ControlKey(int16(kmsg.ShareGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := req.ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
		resp.SetVersion(req.GetVersion())
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		msg := "not authorized"
		resp.ErrorMessage = &msg
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
	probes := shutdown.NewProbes(r, 10*time.Second, shutdown.ContactLimit(2*time.Second))
	probes.Started()
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(50 * time.Millisecond) {
		if ok, why := probes.Ready(); ok {
			m := r.Stats().Member
			t.Fatalf("ready %v after start (%q) with every ShareGroupHeartbeat refused GROUP_AUTHORIZATION_FAILED: joined %v, contact %v ago, err %q",
				time.Since(start).Round(time.Millisecond), why, m.Joined, time.Since(m.ContactAt).Round(time.Millisecond), m.ContactErr)
		}
	}
}
