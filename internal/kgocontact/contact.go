// Package kgocontact records when a group's coordinator last answered a
// franz-go client, for the Membership of the two sources over kgo (franz
// and share).
package kgocontact

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Contact is when the coordinator last answered and the last error since.
// It is a kgo hook (add it with kgo.WithHooks): franz-go calls it from its
// connections' goroutines; it takes only its own lock. The zero Contact is
// ready to use and safe for concurrent use.
//
// As a hook alone it counts an answer to a coordinator request whatever
// its error code: kgo's hooks do not carry the response. With the options
// of WireOptions on the client too, it reads the answers off the wire
// instead, and counts only those without a group-level error (Answer).
type Contact struct {
	// Answered, if set, is called (outside the lock) after each answer
	// counted as contact. Without WireOptions only Key is set (Err nil,
	// Epoch -1).
	Answered func(Answer)
	// Refused, if set, is called (outside the lock) after each answer
	// read off the wire that refuses the member (Answer.Refused); never
	// without WireOptions.
	Refused func(Answer)

	wire atomic.Bool // answers come from the wire (WireOptions), not OnBrokerE2E

	mu  sync.Mutex
	at  time.Time
	err string
}

var (
	_ kgo.HookBrokerE2E        = (*Contact)(nil)
	_ kgo.HookBrokerConnect    = (*Contact)(nil)
	_ kgo.HookGroupManageError = (*Contact)(nil)
)

// Read returns when the coordinator last answered (zero before any answer)
// and the last error since ("" if none).
func (c *Contact) Read() (time.Time, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, c.err
}

func (c *Contact) answered(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.err = at, ""
}

func (c *Contact) failed(err error) {
	msg := err.Error() // franz-go's and net's errors name addresses, never credentials
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = msg
}

// coordinatorRequest reports whether key is a request only a group's
// coordinator answers.
func coordinatorRequest(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup,
		kmsg.OffsetCommit, kmsg.OffsetFetch, kmsg.ConsumerGroupHeartbeat, kmsg.ShareGroupHeartbeat:
		return true
	}
	return false
}

// OnBrokerE2E records a failed write or read of any request, and unless
// the answers come from the wire (WireOptions) an answer to a coordinator
// request, whatever its error code (REBALANCE_IN_PROGRESS is the
// coordinator answering).
func (c *Contact) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	switch err := e2e.Err(); {
	case err != nil:
		c.failed(err)
	case coordinatorRequest(key) && !c.wire.Load():
		c.answered(time.Now())
		if c.Answered != nil {
			c.Answered(Answer{Key: key, Epoch: -1})
		}
	}
}

// answer records one answer read off the wire: contact unless it is a
// refusal (Answer.Refused), whose error is recorded instead.
func (c *Contact) answer(a Answer) {
	if a.Refused() {
		c.failed(a.Err)
		if c.Refused != nil {
			c.Refused(a)
		}
		return
	}
	c.answered(time.Now())
	if c.Answered != nil {
		c.Answered(a)
	}
}

// WireOptions returns the kgo options that make c read the coordinator's
// answers off the client's connections (WatchConn), to append after opts,
// the client's other options: a Dialer that wraps the one opts make (their
// own Dialer, or kgo's default with their DialTLSConfig and DialTimeout;
// the connection is watched above TLS), and no DialTLSConfig, which the
// wrapped dialer already applies. It fails if opts do not make a client.
func (c *Contact) WireOptions(opts []kgo.Opt) ([]kgo.Opt, error) {
	probe, err := kgo.NewClient(opts...) // connects to nothing: only reads the options
	if err != nil {
		return nil, err
	}
	dial, _ := probe.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	probe.Close()
	if dial == nil {
		return nil, errors.New("kgocontact: the client has no dialer")
	}
	c.wire.Store(true)
	return []kgo.Opt{
		kgo.DialTLSConfig(nil),
		kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			conn, err := dial(ctx, network, host)
			if err != nil {
				return nil, err
			}
			return WatchConn(conn, c.answer), nil
		}),
	}, nil
}

// OnBrokerConnect records a failed dial of any broker.
func (c *Contact) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		c.failed(err)
	}
}

// OnGroupManageError records the error that ended a group session.
func (c *Contact) OnGroupManageError(err error) { c.failed(err) }
