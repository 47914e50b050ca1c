// Package kgocontact records when a group's coordinator last answered a
// franz-go client, for the Membership of the two sources over kgo (franz
// and share).
package kgocontact

import (
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Contact is when the coordinator last answered and the last error since.
// It is a kgo hook (add it with kgo.WithHooks): franz-go calls it from its
// connections' goroutines; it takes only its own lock. The zero Contact is
// ready to use and safe for concurrent use.
type Contact struct {
	// Answered, if set, is called (outside the lock) after each answer to
	// a coordinator request, with the request's key.
	Answered func(key int16)

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

// OnBrokerE2E records an answer to a coordinator request, whatever its
// error code (REBALANCE_IN_PROGRESS is the coordinator answering), and a
// failed write or read of any request.
func (c *Contact) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	switch err := e2e.Err(); {
	case err != nil:
		c.failed(err)
	case coordinatorRequest(key):
		c.answered(time.Now())
		if c.Answered != nil {
			c.Answered(key)
		}
	}
}

// OnBrokerConnect records a failed dial of any broker.
func (c *Contact) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		c.failed(err)
	}
}

// OnGroupManageError records the error that ended a group session.
func (c *Contact) OnGroupManageError(err error) { c.failed(err) }
