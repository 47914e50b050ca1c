package shutdown_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// statsRunner is a Runner whose Stats a test sets.
type statsRunner struct {
	mu sync.Mutex
	s  runner.Stats
}

func (r *statsRunner) set(s runner.Stats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.s = s
}

func (r *statsRunner) Stats() runner.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}

func (r *statsRunner) Shutdown(context.Context) error { return nil }
func (r *statsRunner) Close() error                   { return nil }

// member returns Stats of a runner whose loop just ticked, with m.
func member(m runner.MemberStats) runner.Stats {
	return runner.Stats{LoopAt: time.Now(), Member: m}
}

const refused = "dial tcp 127.0.0.1:1: connect: connection refused"

// TestReadiness checks what readiness makes of the runner's membership,
// and the reason it gives. Inside the bubble time.Now is fixed, so ages
// are exact.
func TestReadiness(t *testing.T) {
	ago := func(d time.Duration) time.Time { return time.Now().Add(-d) }
	joined := func(contact time.Time, err string) runner.MemberStats {
		return runner.MemberStats{Group: "orders", Joined: true, MemberInfo: runner.MemberInfo{MemberID: "m1", Generation: 3, ContactAt: contact, ContactErr: err},
			Rebalances: []runner.Rebalance{{At: ago(time.Minute), Kind: "assigned", Generation: 3}}}
	}
	cases := []struct {
		name  string
		opts  []shutdown.ProbeOption
		stats func() runner.Stats
		ready bool
		why   string
	}{
		{"never reached the broker (a wrong address)", nil, func() runner.Stats {
			return member(runner.MemberStats{Group: "orders", MemberInfo: runner.MemberInfo{Generation: -1, ContactErr: refused}})
		}, false, `not a member of group "orders" yet (no assignment yet): no answer from the group coordinator yet: ` + refused},
		{"answered, not assigned yet", nil, func() runner.Stats {
			return member(runner.MemberStats{Group: "orders", MemberInfo: runner.MemberInfo{MemberID: "m1", Generation: -1, ContactAt: ago(2 * time.Second)}})
		}, false, `not a member of group "orders" yet (no assignment yet): last answer from the group coordinator 2s ago`},
		{"joined, answered now", nil, func() runner.Stats { return member(joined(ago(time.Second), "")) }, true, "ok"},
		{"joined, an empty assignment", nil, func() runner.Stats {
			m := joined(ago(time.Second), "")
			m.Rebalances[0].Partitions = nil
			return member(m)
		}, true, "ok"},
		{"no answer for 41s, limit 30s", []shutdown.ProbeOption{shutdown.ContactLimit(30 * time.Second)}, func() runner.Stats {
			return member(joined(ago(41*time.Second), refused))
		}, false, "no answer from the group coordinator for 41s (limit 30s): " + refused},
		{"no answer for 29s, limit 30s", []shutdown.ProbeOption{shutdown.ContactLimit(30 * time.Second)}, func() runner.Stats {
			return member(joined(ago(29*time.Second), refused))
		}, true, "ok"},
		{"the default limit holds 89s", nil, func() runner.Stats { return member(joined(ago(89*time.Second), "")) }, true, "ok"},
		{"the default limit is 90s", nil, func() runner.Stats {
			return member(joined(ago(91*time.Second), ""))
		}, false, "no answer from the group coordinator for 1m31s (limit 1m30s)"},
		{"a source that does not report contact", nil, func() runner.Stats {
			return member(runner.MemberStats{Joined: true, MemberInfo: runner.MemberInfo{Generation: -1}})
		}, true, "ok"},
		{"membership lost", nil, func() runner.Stats {
			m := joined(ago(5*time.Second), "heartbeat: i/o timeout")
			m.Joined = false
			m.Rebalances = append(m.Rebalances, runner.Rebalance{At: ago(4 * time.Second), Kind: "lost", Generation: 3})
			return member(m)
		}, false, `not a member of group "orders" (membership lost 4s ago): last answer from the group coordinator 5s ago: heartbeat: i/o timeout`},
		{"stopping", nil, func() runner.Stats {
			s := member(joined(ago(time.Second), ""))
			s.Stopping = true
			return s
		}, false, "draining"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &statsRunner{}
				r.set(tc.stats())
				p := shutdown.NewProbes(r, time.Minute, tc.opts...)
				if ok, why := p.Ready(); ok || why != "not started" {
					t.Fatalf("Ready before Started = %v %q, want false \"not started\"", ok, why)
				}
				p.Started()
				ok, why := p.Ready()
				if ok != tc.ready || why != tc.why {
					t.Fatalf("Ready = %v %q\nwant    %v %q", ok, why, tc.ready, tc.why)
				}
				code, body := get(t, p.Handler(), "/readyz")
				if want := map[bool]int{true: 200, false: 503}[tc.ready]; code != want || body != tc.why {
					t.Fatalf("/readyz = %d %q, want %d %q", code, body, want, tc.why)
				}
				if ok, why := p.Live(); !ok {
					t.Fatalf("Live = false %q with the loop ticking: liveness must not follow the membership", why)
				}
			})
		})
	}
}

// TestReadinessFollowsTheContact: a joined member goes unready once the
// coordinator has not answered for longer than the limit, and ready again
// at the next answer; draining turns it off for good.
func TestReadinessFollowsTheContact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &statsRunner{}
		contact := func() {
			r.set(member(runner.MemberStats{Joined: true, MemberInfo: runner.MemberInfo{MemberID: "m", ContactAt: time.Now()}}))
		}
		contact()
		p := shutdown.NewProbes(r, time.Minute, shutdown.ContactLimit(10*time.Second))
		p.Started()
		time.Sleep(10 * time.Second)
		if ok, why := p.Ready(); !ok {
			t.Fatalf("Ready = false %q at the limit", why)
		}
		time.Sleep(time.Second)
		if ok, _ := p.Ready(); ok {
			t.Fatal("Ready = true 11s after the last answer, limit 10s")
		}
		contact()
		if ok, why := p.Ready(); !ok {
			t.Fatalf("Ready = false %q after a new answer", why)
		}
		p.Draining()
		if ok, why := p.Ready(); ok || why != "draining" {
			t.Fatalf("Ready = %v %q after Draining, want false \"draining\"", ok, why)
		}
	})
}

// TestLiveness checks that liveness fails only when the poll loop stopped:
// Run returned outside a shutdown, or the loop's tick is stale or never
// came; a Kafka outage does not fail it.
func TestLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &statsRunner{}
		p := shutdown.NewProbes(r, 10*time.Second)
		if ok, why := p.Live(); !ok || why != "starting" {
			t.Fatalf("Live before Started = %v %q, want true \"starting\"", ok, why)
		}
		p.Started()
		time.Sleep(10 * time.Second)
		if ok, why := p.Live(); !ok || why != "starting" {
			t.Fatalf("Live 10s after Started with no tick = %v %q, want true \"starting\" (limit 10s)", ok, why)
		}
		time.Sleep(time.Second)
		if ok, why := p.Live(); ok || !strings.Contains(why, "has not ticked since it started 11s ago") {
			t.Fatalf("Live 11s after Started with no tick = %v %q, want false", ok, why)
		}
		// A Kafka outage: the loop ticks, the member lost its group and
		// the coordinator has not answered for ten minutes.
		r.set(runner.Stats{LoopAt: time.Now(), Member: runner.MemberStats{MemberInfo: runner.MemberInfo{ContactAt: time.Now().Add(-10 * time.Minute), ContactErr: refused}}})
		if ok, why := p.Live(); !ok || why != "ok" {
			t.Fatalf("Live during a Kafka outage = %v %q, want true \"ok\"", ok, why)
		}
		p.Stopped()
		if ok, why := p.Live(); ok || why != "the runner stopped: Run returned" {
			t.Fatalf("Live after Run returned = %v %q, want false", ok, why)
		}
		if ok, why := p.Ready(); ok || why != "stopped" {
			t.Fatalf("Ready after Run returned = %v %q, want false \"stopped\"", ok, why)
		}
		p.Draining()
		if ok, why := p.Live(); !ok || why != "stopped after a shutdown" {
			t.Fatalf("Live after a shutdown's Run returned = %v %q, want true", ok, why)
		}
	})
}
