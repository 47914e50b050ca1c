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
//   - capability/cooperative and capability/static: see Capabilities.
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
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, f)
		})
	}
	t.Run("capability", func(t *testing.T) {
		t.Parallel()
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
