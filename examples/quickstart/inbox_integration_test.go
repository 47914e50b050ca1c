//go:build integration

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestQuickstartInbox runs the program as make quickstart does, on the
// test bed's broker and database: every order applied once through the
// inbox, one row each, the offsets committed to the end.
func TestQuickstartInbox(t *testing.T) {
	brokers, dsn := os.Getenv("TIDEMARK_KAFKA_BROKERS"), os.Getenv("TIDEMARK_PG_DSN")
	if brokers == "" || dsn == "" {
		t.Fatal("TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN must be set: scripts/testbed up && source .testbed/env")
	}
	cfg, err := parseFlags([]string{"-brokers", brokers, "-dsn", dsn, "-records", "3000", "-partitions", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"handled     3000 orders",
		"twice       0\n",
		"rows        3000 in quickstart_orders (through the inbox)",
		"committed   3 of 3 partitions at their end offset, 0 records behind",
		"result      OK",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the summary has no %q:\n%s", want, out.String())
		}
	}
}
