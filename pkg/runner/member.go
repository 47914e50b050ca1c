package runner

import (
	"slices"
	"sync"
	"time"
)

// Membership is an optional Source interface: the source's view of its group
// membership. The runner calls it from Stats, on any goroutine, concurrently
// with every other method of the source: it must be safe for concurrent use,
// must not block, and must not call the Sink.
type Membership interface {
	Membership() MemberInfo
}

// MemberInfo is what a source knows of its membership of its group.
type MemberInfo struct {
	// MemberID is the id the group coordinator gave this member; "" before
	// the first join.
	MemberID string
	// InstanceID is the static membership id (group.instance.id), "" if
	// none.
	InstanceID string
	// Generation is the group generation (classic protocol) or member epoch
	// (KIP-848) the member last joined with; -1 when unknown.
	Generation int32
	// ContactAt is when the group's coordinator last answered a request of
	// this member (heartbeat, join, sync, commit, offset fetch); zero before
	// any answer.
	ContactAt time.Time
	// ContactErr is the last error talking to the coordinator or the
	// brokers since ContactAt, "" if none. It never holds a secret.
	ContactErr string
}

// MemberStats is the runner's view of its membership, in Stats.
type MemberStats struct {
	// Group is the source's group (Grouped), "" if unknown.
	Group string
	// MemberInfo is the source's own view (Membership); its zero value with
	// Generation -1 when the source does not implement Membership.
	MemberInfo
	// Joined is true once an assignment report (Sink.Assigned, even one
	// with no partitions) came after the last loss of membership (Sink.Lost,
	// even one with no partitions) and false before the first.
	Joined bool
	// Rebalances are the most recent rebalance reports (up to
	// MaxRebalances), oldest first.
	Rebalances []Rebalance
}

// MaxRebalances is how many rebalance reports MemberStats keeps.
const MaxRebalances = 32

// Rebalance is one rebalance report of the source: an assignment, a revoke
// or a loss.
type Rebalance struct {
	// At is when the runner had acted on it.
	At time.Time
	// Kind is "assigned", "revoked" or "lost".
	Kind string
	// Partitions are the partitions of the report, as the source gave them.
	Partitions []TP
	// Generation is the generation of the assignment the report is about:
	// an assignment's own, or for a revoke or loss the generation in which
	// the runner was given the first of its partitions that it held; -1 when
	// unknown.
	Generation int32
	// Took is how long the runner took to act on it: for an assignment the
	// assign hook and the set-up, for a revoke the drain and the final
	// commit, for a loss until no earlier commit could reach the source.
	Took time.Duration
}

// memberLog records the rebalance reports for Stats. The source's goroutines
// write it (from the Sink's methods, after the loop acted), Stats reads it;
// its mutex is held for neither the loop's work nor a call to the source.
type memberLog struct {
	mu      sync.Mutex
	joined  bool
	history []Rebalance  // a ring of up to MaxRebalances, oldest at next
	next    int          // where the next report goes once history is full
	gens    map[TP]int32 // the generation each held partition was assigned in
}

// record adds one report the runner has acted on.
func (m *memberLog) record(kind string, tps []TP, gen int32, began, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gens == nil {
		m.gens = map[TP]int32{}
	}
	switch kind {
	case "assigned":
		m.joined = true
		for _, tp := range tps {
			m.gens[tp] = gen
		}
	case "revoked", "lost":
		gen = NoGeneration
		for _, tp := range tps {
			if g, ok := m.gens[tp]; ok {
				if gen == NoGeneration {
					gen = g
				}
				delete(m.gens, tp)
			}
		}
		if kind == "lost" {
			m.joined = false
		}
	}
	r := Rebalance{At: at, Kind: kind, Partitions: slices.Clone(tps), Generation: gen, Took: at.Sub(began)}
	if len(m.history) < MaxRebalances {
		m.history = append(m.history, r)
		return
	}
	m.history[m.next] = r
	m.next = (m.next + 1) % MaxRebalances
}

// stats returns the log's part of MemberStats: Joined and Rebalances.
func (m *memberLog) stats() (joined bool, history []Rebalance) {
	m.mu.Lock()
	defer m.mu.Unlock()
	history = make([]Rebalance, 0, len(m.history))
	history = append(history, m.history[m.next:]...)
	history = append(history, m.history[:m.next]...)
	return m.joined, history
}

// memberStats builds Stats.Member: the runner's log and the source's view.
func (r *Runner) memberStats() MemberStats {
	ms := MemberStats{Group: r.group, MemberInfo: MemberInfo{Generation: NoGeneration}}
	if m, ok := r.src.(Membership); ok {
		ms.MemberInfo = m.Membership()
	}
	ms.Joined, ms.Rebalances = r.member.stats()
	return ms
}

// assignedGeneration is the generation of an assignment report: its
// partitions', or -1 when they do not say (none, or -1).
func assignedGeneration(parts []Assignment) int32 {
	if len(parts) == 0 {
		return NoGeneration
	}
	return parts[0].Generation
}

// assignedTPs returns the partitions of an assignment report.
func assignedTPs(parts []Assignment) []TP {
	tps := make([]TP, len(parts))
	for i, a := range parts {
		tps[i] = a.TP
	}
	return tps
}
