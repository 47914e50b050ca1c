package kgocontact_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
)

// TestContact: only answers to coordinator requests count as contact; any
// failure is recorded until the next answer.
func TestContact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var keys []int16
		c := &kgocontact.Contact{Answered: func(a kgocontact.Answer) { keys = append(keys, a.Key) }}
		var meta kgo.BrokerMetadata
		if at, err := c.Read(); !at.IsZero() || err != "" {
			t.Fatalf("zero Contact reads %v %q", at, err)
		}
		c.OnBrokerE2E(meta, int16(kmsg.Fetch), kgo.BrokerE2E{})
		if at, _ := c.Read(); !at.IsZero() {
			t.Fatal("a fetch answer counted as the coordinator's")
		}
		c.OnBrokerConnect(meta, 0, nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
		if _, err := c.Read(); err != "dial tcp 127.0.0.1:1: connect: connection refused" {
			t.Fatalf("failed dial recorded as %q", err)
		}
		first := time.Now()
		c.OnBrokerE2E(meta, int16(kmsg.Heartbeat), kgo.BrokerE2E{})
		if at, err := c.Read(); !at.Equal(first) || err != "" {
			t.Fatalf("after a heartbeat answer: %v %q, want %v and no error", at, err, first)
		}
		time.Sleep(time.Second)
		c.OnBrokerE2E(meta, int16(kmsg.ShareGroupHeartbeat), kgo.BrokerE2E{ReadErr: errors.New("i/o timeout")})
		if at, err := c.Read(); !at.Equal(first) || err != "i/o timeout" {
			t.Fatalf("after a failed heartbeat: %v %q, want the earlier answer and the error", at, err)
		}
		c.OnGroupManageError(errors.New("session ended"))
		if _, err := c.Read(); err != "session ended" {
			t.Fatalf("group error recorded as %q", err)
		}
		c.OnBrokerE2E(meta, int16(kmsg.OffsetCommit), kgo.BrokerE2E{})
		if at, err := c.Read(); !at.Equal(first.Add(time.Second)) || err != "" {
			t.Fatalf("after a commit answer: %v %q", at, err)
		}
		if len(keys) != 2 || keys[0] != int16(kmsg.Heartbeat) || keys[1] != int16(kmsg.OffsetCommit) {
			t.Fatalf("Answered called with %v, want Heartbeat then OffsetCommit", keys)
		}
	})
}

// TestContactWire: once WireOptions made the client's dialer watch the
// wire, a hook's success (OnBrokerE2E) is no contact: kgo's hooks do not
// say whether the answer refused the member. A TLS config and a Dialer
// together are what kgo refuses, so WireOptions clears the TLS config it
// folded into the dialer.
func TestContactWire(t *testing.T) {
	c := &kgocontact.Contact{}
	opts, err := c.WireOptions([]kgo.Opt{kgo.DialTLS()})
	if err != nil {
		t.Fatalf("WireOptions: %v", err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.DialTLS()}, opts...)...)
	if err != nil {
		t.Fatalf("a client with the wire options: %v", err)
	}
	cl.Close()
	c.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.ShareGroupHeartbeat), kgo.BrokerE2E{})
	if at, _ := c.Read(); !at.IsZero() {
		t.Fatal("a hook's success counted as contact with the answers read off the wire")
	}
}
