package share

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
)

// Option configures a Source.
type Option func(*config)

type config struct {
	sessions       int
	maxPollRecords int
	closeTimeout   time.Duration
	groupConfigs   [][2]string
	clientOpts     []kgo.Opt
	logger         *slog.Logger
	meterProvider  metric.MeterProvider
}

// Defaults the options document.
const (
	defaultSessions       = 4
	defaultMaxPollRecords = 512
	defaultCloseTimeout   = 10 * time.Second
)

func defaults() config {
	return config{
		sessions:       defaultSessions,
		maxPollRecords: defaultMaxPollRecords,
		closeTimeout:   defaultCloseTimeout,
		logger:         slog.Default(),
	}
}

// Sessions sets how many share sessions the source runs: separate franz-go
// clients in the same group, each polling, handing over and settling its
// own records. A session polls again only once every record of its last
// poll is settled, so one slow record holds back only its session's next
// poll; more sessions keep the runner's workers busy behind stragglers, at
// the cost of a connection each. At most Sessions × MaxPollRecords records
// are held at once. Default 4.
func Sessions(n int) Option { return func(c *config) { c.sessions = n } }

// MaxPollRecords sets the most records one session acquires and hands over
// per poll (kgo.ShareMaxRecords, strict: the broker acquires no more).
// Default 512: with 5 ms handlers at Concurrency 64, 4 sessions of 512 came
// within a few percent of the consumer-group source (docs/share.md).
func MaxPollRecords(n int) Option { return func(c *config) { c.maxPollRecords = n } }

// CloseTimeout bounds Close: flushing the acks (the releases of the records
// still held included) and leaving the group. Default 10s.
func CloseTimeout(d time.Duration) Option { return func(c *config) { c.closeTimeout = d } }

// GroupConfig sets a share-group config when Run starts, before the
// sessions join (IncrementalAlterConfigs SET on the GROUP resource), for
// example share.auto.offset.reset=earliest, share.record.lock.duration.ms,
// share.delivery.count.limit or, on Kafka 4.4, errors.deadletterqueue.topic.name.
// Group configs are the group's, not the member's: every member sees the
// last value set. A key given twice takes the later value. Default none.
func GroupConfig(key, value string) Option {
	return func(c *config) {
		// The broker refuses a request that sets a key twice
		// (INVALID_REQUEST): a key given again takes its new value in
		// place.
		for i, kv := range c.groupConfigs {
			if kv[0] == key {
				c.groupConfigs[i][1] = value
				return
			}
		}
		c.groupConfigs = append(c.groupConfigs, [2]string{key, value})
	}
}

// ClientOptions adds franz-go options to every session's client, for
// example TLS, SASL or kgo.ConnIdleTimeout. The options the source depends
// on (seed brokers, the share group, topics, the record limit, the ack
// callback) are applied after them and cannot be overridden.
//
// New builds one more client per session from these options and closes it
// at once, without a connection: it reads off it the dialer they make, so
// that readiness can watch the coordinator's answers on the wire. A hook
// given here (kgo.WithHooks) is told of that client's creation and close
// too.
func ClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// MeterProvider sets the OpenTelemetry meter provider of the source's own
// metric, tidemark.share.acks_refused (the runner's metrics, counted
// settlements included, come from runner.MeterProvider). Default the
// global provider.
func MeterProvider(p metric.MeterProvider) Option { return func(c *config) { c.meterProvider = p } }

// Logger sets the structured logger. Default slog.Default().
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// ConfigError is returned by New for an invalid argument or option; Option
// names it.
type ConfigError struct {
	Option string
	Reason string
}

func (e *ConfigError) Error() string { return "share: option " + e.Option + ": " + e.Reason }

func (c *config) validate() error {
	bad := func(opt, format string, a ...any) error {
		return &ConfigError{Option: opt, Reason: fmt.Sprintf(format, a...)}
	}
	switch {
	case c.sessions < 1:
		return bad("Sessions", "%d is not positive", c.sessions)
	case c.maxPollRecords < 1:
		return bad("MaxPollRecords", "%d is not positive", c.maxPollRecords)
	case c.closeTimeout <= 0:
		return bad("CloseTimeout", "%v is not positive", c.closeTimeout)
	case c.logger == nil:
		return bad("Logger", "nil logger")
	}
	for _, kv := range c.groupConfigs {
		if kv[0] == "" {
			return bad("GroupConfig", "empty key")
		}
	}
	return nil
}
