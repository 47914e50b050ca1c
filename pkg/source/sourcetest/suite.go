package sourcetest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Factory builds the sources of one adapter for the suite.
type Factory struct {
	// Brokers are the seed brokers of the Kafka cluster the scenarios run
	// on. The suite creates (and deletes) its own topics and groups there.
	Brokers []string
	// New returns a new, not yet running, source for one group member
	// configured as cfg says. The suite runs it under a runner, which
	// closes it.
	New func(cfg Config) (runner.Source, error)
	// Capabilities declares what the adapter can do; the suite checks the
	// declaration both ways.
	Capabilities Capabilities
}

// Capabilities are the group-membership features an adapter may lack.
// For each one the suite runs a subtest named capability/<name>=present or
// capability/<name>=absent that checks the adapter behaves as declared:
// a missing feature is a passing check of the documented fallback, never a
// skipped test.
type Capabilities struct {
	// Cooperative: incremental rebalances (KIP-429). When a member joins,
	// an existing member is asked to revoke only the partitions that move,
	// and keeps consuming the others. Absent means eager: every rebalance
	// revokes every partition of every member, so the whole group stops
	// while the slowest member drains.
	Cooperative bool
	// StaticMembership: Config.InstanceID makes the member static
	// (KIP-345): it does not leave the group on Close, and a restart with
	// the same id within the session timeout gets its partitions back
	// without a rebalance. Absent means the adapter joins as a dynamic
	// member whatever InstanceID says, and leaves the group on Close.
	StaticMembership bool
	// Share: the adapter is a share-group source (KIP-932, a
	// runner.Settler): the broker hands each record to one member at a
	// time under an acquisition lock, the adapter settles records one by
	// one, and there are no commits, no revokes and no partition owner.
	// Present: Run runs the scenarios whose promises a share group makes
	// (storm, transactions, flow, shutdown; "done" is the share group's
	// lag 0, not a committed offset), and capability/share=present checks
	// that two members handle one partition's records at the same time.
	// Absent: capability/share=absent checks that a partition's records
	// run in one member at a time, each once.
	Share bool
}

// Config is one member's configuration, passed to Factory.New.
type Config struct {
	Brokers []string
	Group   string
	Topics  []string
	// InstanceID is set only by the static-membership scenario: a static
	// member id for an adapter with that capability. An adapter without it
	// should ignore it (and join as a dynamic member).
	InstanceID string
	// The group timings the member must use.
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
	// Logger is the member's logger (it writes to the test's output).
	Logger *slog.Logger
}

// Run runs every scenario against the adapter f builds, each as a parallel
// subtest with its own topics and group on f.Brokers. A missing broker
// fails the scenarios; nothing is skipped. The scenarios take about a
// minute in total with two running at a time (go test's default -parallel
// on two cores).
//
//   - storm: members join and leave every second while 20,000 keyed records
//     are produced and until all are handled: no record is missed,
//     committed offsets never go backward, no key runs twice at once in a
//     member, and the first handling of each key's records follows offset
//     order. RunStorm runs it alone at another size.
//   - revoke: a member joins while another has slow handlers in flight:
//     the revoke drains them and commits exactly their prefix before the
//     new owner starts, so every record is handled exactly once.
//   - lost: a member is evicted from the group (LeaveGroup with its member
//     id) while its connections stay up: it reports its partitions lost and
//     never gets a commit for them acknowledged afterwards.
//   - transactions: committed and aborted transactions: no aborted record
//     is handled, every committed one exactly once, and the committed
//     offset reaches the end of each partition, past the final markers
//     (lag 0).
//   - flow: slow handlers under small water marks: no hand-over carries
//     more records than the runner's budget, a partition's buffered plus
//     in-flight records never exceed the high water mark, and pausing and
//     resuming loses or repeats nothing.
//   - shutdown: with one handler stuck, Shutdown commits the safe prefix of
//     every partition, reports the stuck record, and leaves the group.
//   - capability/cooperative, capability/static and capability/share: see
//     Capabilities.
//
// A share adapter (Capabilities.Share) runs storm, transactions, flow and
// shutdown, each judged by the share group's acknowledgements (lag 0)
// instead of committed offsets, and capability/share only: its storm
// checks that no record runs in two members at once, its shutdown that
// the stuck record is released (not accepted) and runs again in the next
// member, and the spy that the runner never commits over it and settles
// only records it was handed, once per hand-over.
func Run(t *testing.T, f Factory) {
	t.Helper()
	if len(f.Brokers) == 0 {
		t.Fatal("sourcetest: Factory.Brokers is empty")
	}
	if f.New == nil {
		t.Fatal("sourcetest: Factory.New is nil")
	}
	scenarios := []struct {
		name string
		run  func(*testing.T, Factory)
	}{
		{"storm", func(t *testing.T, f Factory) { storm(t, f, Storm{}) }},
		{"revoke", revokeDrain},
		{"lost", lostAfterEviction},
		{"transactions", transactions},
		{"flow", flow},
		{"shutdown", shutdown},
	}
	if f.Capabilities.Share {
		// The group scenarios' promises (revoke drains, losses, rebalance
		// protocols, static members) are a consumer group's; a share
		// group has none of them.
		scenarios = []struct {
			name string
			run  func(*testing.T, Factory)
		}{
			{"storm", shareStorm},
			{"transactions", transactions},
			{"flow", flow},
			{"shutdown", shareShutdown},
		}
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, f)
		})
	}
	t.Run("capability", func(t *testing.T) {
		t.Parallel()
		t.Run("share="+presence(f.Capabilities.Share), func(t *testing.T) {
			t.Parallel()
			shareCapability(t, f)
		})
		if f.Capabilities.Share {
			return
		}
		t.Run("cooperative="+presence(f.Capabilities.Cooperative), func(t *testing.T) {
			t.Parallel()
			cooperative(t, f)
		})
		t.Run("static="+presence(f.Capabilities.StaticMembership), func(t *testing.T) {
			t.Parallel()
			static(t, f)
		})
	})
}

func presence(b bool) string {
	if b {
		return "present"
	}
	return "absent"
}
