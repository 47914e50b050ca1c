package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// cluster is a fake one-broker Kafka cluster for one test.
func cluster(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// TestQuickstart runs the program against a fake cluster, in memory (no
// -dsn): every order produced is handled once, and the group's committed
// offsets are the topic's end offsets.
func TestQuickstart(t *testing.T) {
	cfg, err := parseFlags([]string{"-brokers", strings.Join(cluster(t), ","), "-dsn", "",
		"-records", "2000", "-partitions", "3", "-keys", "50", "-topic", "orders"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"handled     2000 orders",
		"twice       0\n",
		"committed   3 of 3 partitions at their end offset, 0 records behind",
		"result      OK",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the summary has no %q:\n%s", want, out.String())
		}
	}
}

// TestQuickstartFlags: the usage errors main exits 2 for.
func TestQuickstartFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-brokers", ""}, "no brokers: pass -brokers or set TIDEMARK_KAFKA_BROKERS"},
		{[]string{"-brokers", "x:1", "-records", "0"}, "must be positive"},
		{[]string{"-brokers", "x:1", "now"}, `unexpected argument "now"`},
		{[]string{"-frob"}, "flag provided but not defined: -frob"},
	}
	for _, tt := range tests {
		_, err := parseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestQuickstartStopsOnSIGTERM runs the built program with slow handlers
// and sends it SIGTERM once it starts consuming: it stops gracefully —
// the summary is printed, nothing was handled twice — and exits 1, saying
// how far it got.
func TestQuickstartStopsOnSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-brokers", strings.Join(cluster(t), ","), "-dsn", "",
		"-records", "5000", "-partitions", "2", "-concurrency", "4", "-work", "5ms", "-topic", "orders")
	pr, pw := io.Pipe()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, pw), &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close() // a program that ends early ends the read below
		done <- err
	}()
	// 5,000 orders at 4 × 5 ms take 6 s or more: SIGTERM once it says it
	// consumes (the first line) comes long before the end.
	line := make([]byte, 256)
	if _, err := pr.Read(line); err != nil || !bytes.HasPrefix(line, []byte("tidemark quickstart: consuming")) {
		cmd.Process.Kill()
		<-done // stderr is complete
		t.Fatalf("first line %q, %v (stderr %s)", line, err, stderr.String())
	}
	go io.Copy(io.Discard, pr)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1\nstdout %s\nstderr %s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "quickstart: stopped (terminated signal received) after ") {
		t.Errorf("stderr %q, want it to say where it stopped", stderr.String())
	}
	if !strings.Contains(stdout.String(), "twice       0\n") || !strings.Contains(stdout.String(), "committed   ") {
		t.Errorf("no summary:\n%s", stdout.String())
	}
}
