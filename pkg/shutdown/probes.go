package shutdown

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Probes serves liveness, readiness and status for one runner. It is safe for
// concurrent use. The zero value is not usable; use NewProbes.
type Probes struct {
	r        Runner
	maxStall time.Duration
	started  atomic.Bool
	draining atomic.Bool
	now      func() time.Time
}

// NewProbes returns probes for r. maxStall is how old the runner's last
// poll-loop tick may be before liveness fails; it must be several of the
// runner's commit intervals (the tick's period). Zero means 30s.
func NewProbes(r Runner, maxStall time.Duration) *Probes {
	if maxStall <= 0 {
		maxStall = 30 * time.Second
	}
	return &Probes{r: r, maxStall: maxStall, now: time.Now}
}

// Started marks the runner as running; call it right before Run.
func (p *Probes) Started() { p.started.Store(true) }

// Draining turns readiness off for good; the coordinator calls it first
// thing on a signal.
func (p *Probes) Draining() { p.draining.Store(true) }

// Live reports whether the poll loop is making progress, and why not.
func (p *Probes) Live() (bool, string) {
	if !p.started.Load() {
		return true, "starting"
	}
	s := p.r.Stats()
	if s.LoopAt.IsZero() {
		// No tick yet: the loop has run for less than a commit interval.
		return true, "starting"
	}
	if age := p.now().Sub(s.LoopAt); age > p.maxStall {
		return false, fmt.Sprintf("poll loop has not ticked for %s (limit %s)", age.Round(time.Millisecond), p.maxStall)
	}
	return true, "ok"
}

// Ready reports whether the service should receive traffic: running and not
// draining.
func (p *Probes) Ready() (bool, string) {
	switch {
	case !p.started.Load():
		return false, "not started"
	case p.draining.Load() || p.r.Stats().Stopping:
		return false, "draining"
	}
	return true, "ok"
}

// Handler serves GET /livez, /readyz (200 or 503 with the reason) and
// /statusz (the runner's Stats as JSON).
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
