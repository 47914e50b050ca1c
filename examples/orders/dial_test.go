package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConfigKafkaDial: -kafka-dial takes broker=address pairs and refuses
// anything else naming the flag; -metadata-max-age takes a duration.
func TestConfigKafkaDial(t *testing.T) {
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders@127.0.0.1:5432/orders")
	c, err := parseConfig([]string{"-kafka-dial", "127.0.0.1:9092=127.0.0.1:1, localhost:9093=127.0.0.1:2", "-metadata-max-age", "7s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.kafkaDial) != 2 || c.kafkaDial["127.0.0.1:9092"] != "127.0.0.1:1" || c.kafkaDial["localhost:9093"] != "127.0.0.1:2" {
		t.Fatalf("-kafka-dial parsed as %v", c.kafkaDial)
	}
	if c.metaMaxAge != 7*time.Second {
		t.Fatalf("-metadata-max-age 7s parsed as %v", c.metaMaxAge)
	}
	for _, args := range [][]string{{"-kafka-dial", "127.0.0.1:9092"}, {"-kafka-dial", "a=b"}, {"-kafka-dial", "127.0.0.1:9092=x"}, {"-metadata-max-age", "soon"}} {
		if _, err := parseConfig(args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("orders %v: %v, want an error naming %s", args, err, args[0])
		}
	}
}

// TestKafkaDialer: the dialer of -kafka-dial dials the address mapped to a
// broker's, and refuses a broker the map does not name rather than dialing
// it directly (which would bypass a test's proxy).
func TestKafkaDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	cfg := config{kafkaDial: map[string]string{"broker:9092": ln.Addr().String()}}
	dial := dialerOf(t, clientOpts(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", "broker:9092")
	if err != nil {
		t.Fatalf("dialing a mapped broker: %v", err)
	}
	c.Close()
	select {
	case <-accepted:
	case <-ctx.Done():
		t.Fatal("the mapped address was not dialed")
	}
	if c, err := dial(ctx, "tcp", "other:9092"); err == nil || !strings.Contains(err.Error(), "other:9092") {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dialing a broker the map does not name: %v, want an error naming it", err)
	}
}

// dialerOf returns the dial function set by opts' kgo.Dialer option.
func dialerOf(t *testing.T, opts []kgo.Opt) func(context.Context, string, string) (net.Conn, error) {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	d, ok := cl.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	if !ok || d == nil {
		t.Fatal("no kgo.Dialer among the client options")
	}
	return d
}
