package franz

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/source/internal/args"
)

// Option configures a Source.
type Option func(*config)

type config struct {
	instanceID        string
	instanceSet       bool
	balancers         []kgo.GroupBalancer
	balancerSet       bool
	eager             bool
	sessionTimeout    time.Duration
	rebalanceTimeout  time.Duration
	heartbeatInterval time.Duration
	serverSide        bool
	clientOpts        []kgo.Opt
	maxPollRecords    int
	logger            *slog.Logger
}

// Defaults the options document. The three group timings are franz-go's
// (and the Java client's) defaults.
const (
	defaultSessionTimeout    = 45 * time.Second
	defaultRebalanceTimeout  = 60 * time.Second
	defaultHeartbeatInterval = 3 * time.Second
	defaultMaxPollRecords    = 500
	defaultFetchMaxWait      = 500 * time.Millisecond
)

func defaults() config {
	return config{
		sessionTimeout:    defaultSessionTimeout,
		rebalanceTimeout:  defaultRebalanceTimeout,
		heartbeatInterval: defaultHeartbeatInterval,
		maxPollRecords:    defaultMaxPollRecords,
		logger:            slog.Default(),
	}
}

// InstanceID makes the member static (KIP-345): a restart with the same id
// within the session timeout gets its partitions back without a rebalance.
// Each running member of the group needs its own id. A static member does
// not send LeaveGroup on Close (franz-go's behaviour, so that a restart does
// not rebalance), so its partitions stay unassigned until the session
// timeout expires or it comes back; raise SessionTimeout to cover a restart.
// Default: none (a dynamic member).
func InstanceID(id string) Option {
	return func(c *config) { c.instanceID, c.instanceSet = id, true }
}

// Balancer sets the group balancers, in order of preference (franz-go's
// kgo.Balancers). Default kgo.CooperativeStickyBalancer(): incremental
// rebalances, in which a member keeps consuming the partitions it keeps and
// only the moved ones are revoked and drained. Every member of a group must
// agree: an eager member in a cooperative group makes the whole group eager.
func Balancer(balancers ...kgo.GroupBalancer) Option {
	return func(c *config) {
		c.balancers, c.balancerSet = balancers, true
		c.eager = false
	}
}

// Eager uses franz-go's eager sticky balancer (kgo.StickyBalancer): every
// rebalance revokes every partition of every member, and each member drains
// and commits all of them before the group moves on. Use it only to join a
// group that is already eager. Default: cooperative (see Balancer).
func Eager() Option {
	return func(c *config) {
		c.balancers, c.balancerSet = []kgo.GroupBalancer{kgo.StickyBalancer()}, true
		c.eager = true
	}
}

// SessionTimeout sets how long the broker waits for a heartbeat before it
// removes the member and its partitions are reported Lost. It must lie
// within the broker's group.min.session.timeout.ms and
// group.max.session.timeout.ms. Default 45s. With ServerSideAssignment the
// broker's group.consumer.session.timeout.ms applies instead.
func SessionTimeout(d time.Duration) Option {
	return func(c *config) { c.sessionTimeout = d }
}

// RebalanceTimeout sets how long the group waits for its members during a
// rebalance, which for this member includes draining the revoked
// partitions: a revoke asks the runner to finish within half of it, and the
// runner's DrainBudget must be below that too. Default 60s.
func RebalanceTimeout(d time.Duration) Option {
	return func(c *config) { c.rebalanceTimeout = d }
}

// HeartbeatInterval sets how often the member heartbeats; it must be below
// the session timeout (a third of it or less is the rule of thumb).
// Heartbeats go on while a revoke drains. Default 3s. With
// ServerSideAssignment the broker decides the interval.
func HeartbeatInterval(d time.Duration) Option {
	return func(c *config) { c.heartbeatInterval = d }
}

// ServerSideAssignment uses the KIP-848 consumer group protocol, in which
// the broker's group coordinator assigns partitions and there is no
// group-wide stop: franz-go's kgo.ServerSideBalancer. It needs Kafka 4.0+;
// franz-go recommends 4.3+, because earlier brokers can answer an offset
// commit during reconciliation with STALE_MEMBER_EPOCH, which the adapter
// returns as a failed commit (the runner retries it with the next one). The
// broker's uniform assignor is used unless Balancer names kgo.RangeBalancer;
// other balancers are an error. On a broker without KIP-848 the client falls
// back to the classic protocol with that (eager) balancer. Default: off (the
// classic protocol).
func ServerSideAssignment() Option {
	return func(c *config) { c.serverSide = true }
}

// ClientOptions appends franz-go client options: TLS, SASL, a custom Dialer,
// client id, and so on. They override the adapter's overridable defaults
// (FetchIsolationLevel(ReadCommitted), ConsumeResetOffset(AtStart),
// FetchMaxWait(500ms), MaxConcurrentFetches(3), a logger over Logger) but
// not the settings the adapter depends on, which it applies last:
// SeedBrokers, ConsumerGroup, ConsumeTopics (none until Run), DisableAutoCommit,
// BlockRebalanceOnPoll, KeepControlRecords, the partition callbacks, and the
// group options above. kgo.FetchMaxBytes and kgo.FetchMaxPartitionBytes are
// replaced by the sizes LimitFetch derives from runner.MaxBufferedBytes
// (runner.New calls it); size fetches through MaxBufferedBytes and
// runner.RecordShape instead. kgo.MaxConcurrentFetches enters that
// derivation: each concurrent fetch gets its part of the budget (fewer
// brokers than it: one part per broker), so a member whose partitions are
// led by more than three brokers may raise it (smaller fetches each). New
// refuses kgo.ConsumeRegex and a negative
// (unbounded) kgo.MaxConcurrentFetches. Default: none.
func ClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// MaxPollRecords caps the records one hand-over gives the runner; the
// runner's budget (room below the high water marks) can lower it further.
// It does not cap what the adapter takes from the client at once: it takes
// the client's whole fetch when the runner has room for it (four times the
// budget for each unpaused partition), so the client fetches the next one
// while the runner works, and hands it over in pieces. Default 500.
func MaxPollRecords(n int) Option {
	return func(c *config) { c.maxPollRecords = n }
}

// Logger sets the structured logger of the adapter and of the franz-go
// client under it (whose log level follows the logger's). Default
// slog.Default().
func Logger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// ConfigError is returned by New for an invalid option or argument; Option
// names it.
type ConfigError struct {
	Option string
	Reason string
}

func (e *ConfigError) Error() string { return "franz: option " + e.Option + ": " + e.Reason }

func (c *config) validate() error {
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: opt, Reason: fmt.Sprintf(format, a...)}
	}
	if c.instanceSet && c.instanceID == "" {
		return bad("InstanceID", "empty instance id")
	}
	if c.balancerSet {
		if reason := args.Balancers(c.balancers); reason != "" {
			return &ConfigError{Option: "Balancer", Reason: reason}
		}
	}
	switch {
	case c.sessionTimeout <= 0:
		return bad("SessionTimeout", "%v is not positive", c.sessionTimeout)
	case c.rebalanceTimeout <= 0:
		return bad("RebalanceTimeout", "%v is not positive", c.rebalanceTimeout)
	case c.heartbeatInterval <= 0:
		return bad("HeartbeatInterval", "%v is not positive", c.heartbeatInterval)
	case c.heartbeatInterval >= c.sessionTimeout:
		return bad("HeartbeatInterval", "%v is not below the session timeout %v", c.heartbeatInterval, c.sessionTimeout)
	case c.maxPollRecords < 1:
		return bad("MaxPollRecords", "%d is not positive", c.maxPollRecords)
	case c.logger == nil:
		return bad("Logger", "nil logger")
	}
	if c.serverSide {
		if c.eager {
			return bad("ServerSideAssignment", "cannot be combined with Eager: the broker assigns")
		}
		if c.balancerSet {
			switch c.balancers[0].ProtocolName() {
			case "sticky", "range":
			default:
				return bad("ServerSideAssignment", "the first balancer must be kgo.StickyBalancer or kgo.RangeBalancer (the broker's uniform or range assignor), got %q", c.balancers[0].ProtocolName())
			}
		}
	}
	return nil
}

// groupBalancers returns the balancers to configure.
func (c *config) groupBalancers() []kgo.GroupBalancer {
	switch {
	case c.balancerSet:
		return c.balancers
	case c.serverSide:
		return []kgo.GroupBalancer{kgo.StickyBalancer()}
	default:
		return []kgo.GroupBalancer{kgo.CooperativeStickyBalancer()}
	}
}
