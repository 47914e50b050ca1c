package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestConfigNeverPrintsTheDSN: the usage text, and every configuration
// error, leave the connection string out: its password would otherwise be
// printed (before, the -dsn flag's default was TIDEMARK_PG_DSN and the
// usage text quoted it).
func TestConfigNeverPrintsTheDSN(t *testing.T) {
	const secret = "s3cret-pw"
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders:"+secret+"@127.0.0.1:5432/orders")
	for _, args := range [][]string{{"-h"}, {"-no-such-flag"}, {"-concurrency", "x"}, {"-dsn", "postgres://orders:" + secret + "@[::1"}} {
		var out bytes.Buffer
		_, err := parseConfig(args, &out)
		text := out.String()
		if err != nil {
			text += err.Error()
		}
		if strings.Contains(text, secret) {
			t.Errorf("orders %v printed the database password:\n%s", args, text)
		}
	}
	c, err := parseConfig(nil, &bytes.Buffer{})
	if err != nil || !strings.Contains(c.dsn, secret) {
		t.Fatalf("TIDEMARK_PG_DSN is not the default of -dsn any more: %v", err)
	}
}

// TestConfigMode: -mode takes group (the default) or share, with
// -share-lock; anything else is refused naming the flag.
func TestConfigMode(t *testing.T) {
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders@127.0.0.1:5432/orders")
	c, err := parseConfig(nil, &bytes.Buffer{})
	if err != nil || c.share {
		t.Fatalf("default: share %v, err %v; want a consumer group", c.share, err)
	}
	c, err = parseConfig([]string{"-mode", "share", "-share-lock", "5s"}, &bytes.Buffer{})
	if err != nil || !c.share || c.shareLock.Seconds() != 5 {
		t.Fatalf("-mode share -share-lock 5s: share %v, lock %v, err %v", c.share, c.shareLock, err)
	}
	for _, args := range [][]string{{"-mode", "queue"}, {"-mode", "share", "-share-lock", "soon"}} {
		if _, err := parseConfig(args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), args[len(args)-2]) {
			t.Errorf("orders %v: %v, want an error naming %s", args, err, args[len(args)-2])
		}
	}
}

// TestConfigEffect: -effect takes idempotent (the default) or strict;
// anything else is refused naming the flag.
func TestConfigEffect(t *testing.T) {
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders@127.0.0.1:5432/orders")
	for _, tc := range []struct {
		args   []string
		env    string
		strict bool
	}{
		{nil, "", false},
		{[]string{"-effect", "idempotent"}, "", false},
		{[]string{"-effect", "strict"}, "", true},
		{nil, "strict", true},
		{[]string{"-effect", "idempotent"}, "strict", false},
	} {
		t.Setenv("ORDERS_EFFECT", tc.env)
		c, err := parseConfig(tc.args, &bytes.Buffer{})
		if err != nil || c.strict != tc.strict {
			t.Errorf("orders %v with ORDERS_EFFECT=%q: strict %v, err %v; want strict %v", tc.args, tc.env, c.strict, err, tc.strict)
		}
	}
	t.Setenv("ORDERS_EFFECT", "")
	if _, err := parseConfig([]string{"-effect", "lax"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-effect") {
		t.Errorf("orders -effect lax: %v, want an error naming -effect", err)
	}
}

// TestConfigMaxBufferedBytes: -max-buffered-bytes (or
// ORDERS_MAX_BUFFERED_BYTES) takes GOMEMLIMIT's format; a bad value is
// refused naming the flag; unset leaves the runner's default.
func TestConfigMaxBufferedBytes(t *testing.T) {
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("TIDEMARK_PG_DSN", "postgres://orders@127.0.0.1:5432/orders")
	for _, tc := range []struct {
		args []string
		env  string
		want int64
	}{
		{nil, "", 0},
		{[]string{"-max-buffered-bytes", "128MiB"}, "", 128 << 20},
		{nil, "1GiB", 1 << 30},
		{[]string{"-max-buffered-bytes", "4096"}, "1GiB", 4096},
	} {
		t.Setenv("ORDERS_MAX_BUFFERED_BYTES", tc.env)
		c, err := parseConfig(tc.args, &bytes.Buffer{})
		if err != nil || c.maxBuffered != tc.want {
			t.Errorf("orders %v with ORDERS_MAX_BUFFERED_BYTES=%q: %d, err %v; want %d", tc.args, tc.env, c.maxBuffered, err, tc.want)
		}
	}
	t.Setenv("ORDERS_MAX_BUFFERED_BYTES", "")
	for _, bad := range []string{"128MB", "-1MiB", "0", "lots", "9999999TiB"} {
		if _, err := parseConfig([]string{"-max-buffered-bytes", bad}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-max-buffered-bytes") {
			t.Errorf("orders -max-buffered-bytes %s: %v, want an error naming -max-buffered-bytes", bad, err)
		}
	}
}

// TestConfigRefusesAPasswordInArgv: a -dsn with a password, URL or
// key=value, is refused without quoting it, pointing to the environment;
// one without a password is taken.
func TestConfigRefusesAPasswordInArgv(t *testing.T) {
	const secret = "s3cret-pw"
	t.Setenv("TIDEMARK_KAFKA_BROKERS", "127.0.0.1:9092")
	for _, dsn := range []string{
		"postgres://orders:" + secret + "@127.0.0.1:5432/orders",
		"postgresql://orders@127.0.0.1/orders?password=" + secret,
		"host=127.0.0.1 user=orders password=" + secret,
		"postgres://orders:" + secret + "@[::1",
	} {
		_, err := parseConfig([]string{"-dsn", dsn}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "TIDEMARK_PG_DSN") || strings.Contains(err.Error(), secret) {
			t.Errorf("-dsn with a password: %v, want a refusal naming TIDEMARK_PG_DSN and not the password", err)
		}
	}
	for _, dsn := range []string{"postgres://orders@127.0.0.1:5432/orders", "host=127.0.0.1 user=orders"} {
		if c, err := parseConfig([]string{"-dsn", dsn}, &bytes.Buffer{}); err != nil || c.dsn != dsn {
			t.Errorf("-dsn %q: %v, want it taken", dsn, err)
		}
	}
}
