package kafkago

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	kafka "github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/pkg/source/internal/args"
)

// Option configures a Source.
type Option func(*config)

type config struct {
	sessionTimeout    time.Duration
	rebalanceTimeout  time.Duration
	heartbeatInterval time.Duration
	joinGroupBackoff  time.Duration
	startOffset       int64
	minBytes          int
	maxBytes          int
	maxWait           time.Duration
	balancers         []kafka.GroupBalancer
	balancerSet       bool
	dialer            *kafka.Dialer
	logger            *slog.Logger
}

// Defaults the options document. The three group timings are the Java
// client's (and the franz adapter's), not kafka-go's 30s/30s/3s.
const (
	defaultSessionTimeout    = 45 * time.Second
	defaultRebalanceTimeout  = 60 * time.Second
	defaultHeartbeatInterval = 3 * time.Second
	defaultJoinGroupBackoff  = time.Second
	defaultMinBytes          = 1
	defaultMaxBytes          = 1 << 20
	defaultMaxWait           = 500 * time.Millisecond
)

func defaults() config {
	return config{
		sessionTimeout:    defaultSessionTimeout,
		rebalanceTimeout:  defaultRebalanceTimeout,
		heartbeatInterval: defaultHeartbeatInterval,
		joinGroupBackoff:  defaultJoinGroupBackoff,
		startOffset:       kafka.FirstOffset,
		minBytes:          defaultMinBytes,
		maxBytes:          defaultMaxBytes,
		maxWait:           defaultMaxWait,
		dialer:            &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true},
		logger:            slog.Default(),
	}
}

// SessionTimeout sets how long the broker waits for a heartbeat before it
// removes the member. kafka-go does not heartbeat while a revoke drains, so
// the drain is bounded by this too (see RebalanceTimeout). It must lie within
// the broker's group.min.session.timeout.ms and group.max.session.timeout.ms.
// Default 45s.
func SessionTimeout(d time.Duration) Option {
	return func(c *config) { c.sessionTimeout = d }
}

// RebalanceTimeout sets how long the group waits for its members to rejoin
// during a rebalance. Every rebalance revokes every partition of every
// member (kafka-go is eager only), and a member rejoins only after it has
// drained and committed them, so a revoke asks the runner to finish within
// (min(SessionTimeout, RebalanceTimeout) − HeartbeatInterval) / 2: half of
// what is left once the rebalance has been noticed (up to one heartbeat
// late), the other half for the final commit and the rejoin. The runner's
// DrainBudget applies if it is shorter. Default 60s, which with the other
// defaults gives a revoke 21s.
func RebalanceTimeout(d time.Duration) Option {
	return func(c *config) { c.rebalanceTimeout = d }
}

// HeartbeatInterval sets how often the member heartbeats, which is also how
// late it can notice a rebalance. It must be below both timeouts (a third of
// the session timeout or less is the rule of thumb). Default 3s.
func HeartbeatInterval(d time.Duration) Option {
	return func(c *config) { c.heartbeatInterval = d }
}

// JoinGroupBackoff sets how long kafka-go waits before it joins again after
// a failed join, for example after the member was removed from the group
// and its old member id was refused. Default 1s (kafka-go's is 5s).
func JoinGroupBackoff(d time.Duration) Option {
	return func(c *config) { c.joinGroupBackoff = d }
}

// StartOffset says where a partition with no committed offset starts:
// kafka.FirstOffset (the log start) or kafka.LastOffset (the last stable
// offset, so only records produced after the assignment are consumed).
// Default kafka.FirstOffset. A committed offset that fell out of the log
// (retention) always restarts at the log start.
func StartOffset(offset int64) Option {
	return func(c *config) { c.startOffset = offset }
}

// MinBytes sets the least data the broker waits for before it answers a
// fetch (up to MaxWait). Default 1.
func MinBytes(n int) Option {
	return func(c *config) { c.minBytes = n }
}

// MaxBytes sets the most data one fetch of one partition may return; the
// broker still returns one record batch larger than it. The runner lowers
// it so that what the adapter holds fits its share of
// runner.MaxBufferedBytes (see Source.LimitFetch): the adapter holds at most
// one fetch per partition. Default 1 MiB.
func MaxBytes(n int) Option {
	return func(c *config) { c.maxBytes = n }
}

// MaxWait sets how long the broker holds a fetch waiting for MinBytes. It is
// also how long a fetch that is in flight when a partition is paused or
// revoked can take to notice. Default 500ms.
func MaxWait(d time.Duration) Option {
	return func(c *config) { c.maxWait = d }
}

// Balancers sets the partition assignment strategies the member offers, in
// order of preference (kafka-go's ConsumerGroupConfig.GroupBalancers). All
// of them are eager: kafka-go has no cooperative protocol. Every member of
// the group must share one; a franz member joining the same group must use
// kgo.RangeBalancer (or another strategy both offer). Default
// kafka.RangeGroupBalancer, then kafka.RoundRobinGroupBalancer.
func Balancers(b ...kafka.GroupBalancer) Option {
	return func(c *config) { c.balancers, c.balancerSet = b, true }
}

// Dialer sets how connections are made: TLS, SASL, client id, a custom dial
// function. The group's coordinator connection uses it as it is; fetches,
// offset lookups and dead-letter writes go through kafka.Transports built
// from its DialFunc (or its Timeout, KeepAlive, LocalAddr and DualStack),
// TLS, SASLMechanism and ClientID. Default: a 10s dial timeout and nothing
// else.
func Dialer(d *kafka.Dialer) Option {
	return func(c *config) { c.dialer = d }
}

// Logger sets the structured logger of the adapter and of kafka-go under it
// (its group lines at debug level, its errors at info level; the adapter
// logs at warn what it acts on). Default slog.Default().
func Logger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// ConfigError is returned by New for an invalid option or argument; Option
// names it.
type ConfigError struct {
	Option string
	Reason string
}

func (e *ConfigError) Error() string { return "kafkago: option " + e.Option + ": " + e.Reason }

func (c *config) validate() error {
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: opt, Reason: fmt.Sprintf(format, a...)}
	}
	// The group protocol carries the timings in int32 milliseconds.
	const maxTiming = time.Duration(math.MaxInt32) * time.Millisecond
	switch {
	case c.sessionTimeout <= 0 || c.sessionTimeout > maxTiming:
		return bad("SessionTimeout", "%v is not in (0, %v]", c.sessionTimeout, maxTiming)
	case c.rebalanceTimeout <= 0 || c.rebalanceTimeout > maxTiming:
		return bad("RebalanceTimeout", "%v is not in (0, %v]", c.rebalanceTimeout, maxTiming)
	case c.heartbeatInterval <= 0:
		return bad("HeartbeatInterval", "%v is not positive", c.heartbeatInterval)
	case c.heartbeatInterval >= min(c.sessionTimeout, c.rebalanceTimeout):
		return bad("HeartbeatInterval", "%v is not below both the session timeout %v and the rebalance timeout %v", c.heartbeatInterval, c.sessionTimeout, c.rebalanceTimeout)
	case c.joinGroupBackoff <= 0 || c.joinGroupBackoff > maxTiming:
		return bad("JoinGroupBackoff", "%v is not in (0, %v]", c.joinGroupBackoff, maxTiming)
	case c.startOffset != kafka.FirstOffset && c.startOffset != kafka.LastOffset:
		return bad("StartOffset", "%d is neither kafka.FirstOffset nor kafka.LastOffset", c.startOffset)
	case c.minBytes < 1:
		return bad("MinBytes", "%d is not positive", c.minBytes)
	case c.maxBytes < c.minBytes || c.maxBytes > math.MaxInt32:
		return bad("MaxBytes", "%d is not in [MinBytes %d, %d]", c.maxBytes, c.minBytes, math.MaxInt32)
	case c.maxWait < time.Millisecond || c.maxWait > maxTiming:
		return bad("MaxWait", "%v is not in [1ms, %v]", c.maxWait, maxTiming)
	case c.dialer == nil:
		return bad("Dialer", "nil dialer")
	case c.logger == nil:
		return bad("Logger", "nil logger")
	}
	if c.balancerSet {
		if reason := args.Balancers(c.balancers); reason != "" {
			return &ConfigError{Option: "Balancers", Reason: reason}
		}
	}
	return nil
}

// drainTimeout is how long a revoke may take: see RebalanceTimeout.
func (c *config) drainTimeout() time.Duration {
	return (min(c.sessionTimeout, c.rebalanceTimeout) - c.heartbeatInterval) / 2
}

// transport builds a kafka.Transport from the dialer. With topics, its
// cached metadata (which routes each request to the partition's leader)
// covers only those topics; without, every topic of the cluster.
func (c *config) transport(topics []string) *kafka.Transport {
	d := c.dialer
	dial := d.DialFunc
	if dial == nil {
		nd := &net.Dialer{Timeout: d.Timeout, KeepAlive: d.KeepAlive, LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay}
		if !d.DualStack {
			nd.FallbackDelay = -1
		}
		dial = nd.DialContext
	}
	t := &kafka.Transport{
		Dial:           dial,
		TLS:            d.TLS,
		SASL:           d.SASLMechanism,
		ClientID:       d.ClientID,
		MetadataTopics: topics,
	}
	if d.Timeout > 0 {
		t.DialTimeout = d.Timeout
	}
	return t
}
