package shutdown

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Probes serves liveness, readiness and status for one runner. It is safe for
// concurrent use. The zero value is not usable; use NewProbes.
type Probes struct {
	r            Runner
	maxStall     time.Duration
	contactLimit time.Duration
	startedAt    atomic.Pointer[time.Time]
	draining     atomic.Bool
	stopped      atomic.Bool
	now          func() time.Time
}

// DefaultContactLimit is how long readiness tolerates no answer from the
// group's coordinator, unless ContactLimit says otherwise. A healthy member
// of the classic protocol can wait this long for an answer: the coordinator
// holds a JoinGroup until every member rejoined, for up to the rebalance
// timeout (60s by default in both adapters), while the slowest member
// drains. 90s leaves half as much again for the answer and a heartbeat.
const DefaultContactLimit = 90 * time.Second

// ProbeOption configures Probes.
type ProbeOption func(*Probes)

// ContactLimit sets how long readiness tolerates no answer from the group's
// coordinator (runner.MemberInfo.ContactAt) before it fails. Set it above
// the source's rebalance timeout, or readiness fails during a slow
// rebalance. Zero or less means DefaultContactLimit.
func ContactLimit(d time.Duration) ProbeOption {
	return func(p *Probes) {
		if d > 0 {
			p.contactLimit = d
		}
	}
}

// NewProbes returns probes for r. maxStall is how old the runner's last
// poll-loop tick may be before liveness fails; it must be several of the
// runner's commit intervals (the tick's period). Zero means 30s.
func NewProbes(r Runner, maxStall time.Duration, opts ...ProbeOption) *Probes {
	if maxStall <= 0 {
		maxStall = 30 * time.Second
	}
	p := &Probes{r: r, maxStall: maxStall, contactLimit: DefaultContactLimit, now: time.Now}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Started marks the runner as running; call it right before Run.
func (p *Probes) Started() {
	now := p.now()
	p.startedAt.CompareAndSwap(nil, &now)
}

// Stopped marks the runner as stopped; call it when Run returned. Unless a
// shutdown began (Draining, or the runner's Stats.Stopping), liveness then
// fails: the poll loop is gone and only a restart brings it back.
func (p *Probes) Stopped() { p.stopped.Store(true) }

// Draining turns readiness off for good; the coordinator calls it first
// thing on a signal.
func (p *Probes) Draining() { p.draining.Store(true) }

// Live reports whether the poll loop is making progress, and why not. It
// fails only when the loop stopped: Run returned outside a shutdown
// (Stopped), or the loop's periodic tick is older than maxStall (or never
// came, maxStall after Started). A slow handler, or an unreachable broker,
// never fails it: the loop keeps ticking through both, and a restart would
// help neither.
func (p *Probes) Live() (bool, string) {
	at := p.startedAt.Load()
	if at == nil {
		return true, "starting"
	}
	s := p.r.Stats()
	shuttingDown := p.draining.Load() || s.Stopping
	if p.stopped.Load() || s.Stopped {
		if shuttingDown {
			return true, "stopped after a shutdown"
		}
		return false, "the runner stopped: Run returned"
	}
	now := p.now()
	if s.LoopAt.IsZero() {
		// No tick yet: the loop has run for less than a commit interval,
		// or it never started ticking.
		if age := now.Sub(*at); age > p.maxStall {
			return false, fmt.Sprintf("poll loop has not ticked since it started %s ago (limit %s)", age.Round(time.Millisecond), p.maxStall)
		}
		return true, "starting"
	}
	if age := now.Sub(s.LoopAt); age > p.maxStall {
		return false, fmt.Sprintf("poll loop has not ticked for %s (limit %s)", age.Round(time.Millisecond), p.maxStall)
	}
	return true, "ok"
}

// Ready reports whether the service should receive traffic, and why not:
// started and not draining, and a member of its group — joined (an
// assignment came since the last loss of membership, an empty one
// included: a group can have more members than partitions), and answered
// by the group's coordinator within the contact limit. Before the first
// answer it is not ready, so a wrong broker address keeps a new pod
// unready. A source that does not report its contact (runner.Membership)
// is judged on the assignments alone.
func (p *Probes) Ready() (bool, string) {
	if p.startedAt.Load() == nil {
		return false, "not started"
	}
	if p.draining.Load() {
		return false, "draining"
	}
	s := p.r.Stats()
	switch {
	case s.Stopping:
		return false, "draining"
	case p.stopped.Load():
		return false, "stopped"
	}
	m := s.Member
	group := "the group"
	if m.Group != "" {
		group = "group " + strconv.Quote(m.Group)
	}
	now := p.now()
	if !m.Joined {
		why := "not a member of " + group
		switch {
		case len(m.Rebalances) > 0 && m.Rebalances[len(m.Rebalances)-1].Kind == "lost":
			why += " (membership lost " + since(now, m.Rebalances[len(m.Rebalances)-1].At) + " ago)"
		case len(m.Rebalances) == 0:
			why += " yet (no assignment yet)"
		}
		switch {
		case m.ContactAt.IsZero():
			why += ": no answer from the group coordinator yet"
		default:
			why += ": last answer from the group coordinator " + since(now, m.ContactAt) + " ago"
		}
		if m.ContactErr != "" {
			why += ": " + m.ContactErr
		}
		return false, why
	}
	if !m.ContactAt.IsZero() {
		if age := now.Sub(m.ContactAt); age > p.contactLimit {
			why := fmt.Sprintf("no answer from the group coordinator for %s (limit %s)", since(now, m.ContactAt), p.contactLimit)
			if m.ContactErr != "" {
				why += ": " + m.ContactErr
			}
			return false, why
		}
	}
	return true, "ok"
}

// since formats now-t to the second (to the millisecond under a second).
func since(now, t time.Time) string {
	d := now.Sub(t)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Handler serves GET /livez, /readyz (200 or 503 with the reason) and
// /statusz (a part of the runner's Stats as JSON; pkg/status serves
// the whole of it, for people).
func (p *Probes) Handler() http.Handler {
	mux := http.NewServeMux()
	probe := func(f func() (bool, string)) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			ok, why := f()
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintln(w, why)
		}
	}
	mux.HandleFunc("GET /livez", probe(p.Live))
	mux.HandleFunc("GET /readyz", probe(p.Ready))
	mux.HandleFunc("GET /statusz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(status(p.r.Stats()))
	})
	return mux
}

type partitionStatus struct {
	Partition     string  `json:"partition"`
	Epoch         uint64  `json:"epoch"`
	Safe          int64   `json:"safe"`
	Acknowledged  int64   `json:"acknowledged"`
	HighWatermark int64   `json:"high_watermark"`
	Buffered      int     `json:"buffered"`
	InFlight      int     `json:"in_flight"`
	Paused        bool    `json:"paused"`
	OldestSeconds float64 `json:"oldest_unfinished_seconds"`
}

type statusDoc struct {
	LoopAt     time.Time         `json:"loop_at"`
	Stopping   bool              `json:"stopping"`
	InFlight   int               `json:"in_flight"`
	Buffered   int               `json:"buffered"`
	Partitions []partitionStatus `json:"partitions"`
}

func status(s runner.Stats) statusDoc {
	d := statusDoc{LoopAt: s.LoopAt, Stopping: s.Stopping, InFlight: s.InFlight, Buffered: s.Buffered, Partitions: []partitionStatus{}}
	for _, p := range s.Partitions {
		d.Partitions = append(d.Partitions, partitionStatus{
			Partition: p.TP.String(), Epoch: p.Epoch, Safe: p.Safe, Acknowledged: p.Acknowledged,
			HighWatermark: p.HighWatermark, Buffered: p.Buffered, InFlight: p.InFlight, Paused: p.Paused,
			OldestSeconds: p.OldestAge.Seconds(),
		})
	}
	return d
}
