// Command kafkaready asks a Kafka broker whether it really serves requests.
// scripts/testbed runs it in a loop while the test bed's broker starts; it is
// not part of tidemark's API.
//
// One run makes one attempt, bounded by -timeout, and exits 0 only when all of
// these succeed:
//
//   - a Metadata request lists at least one broker and a controller;
//   - a validate-only CreateTopics request is accepted (the controller path);
//   - FindCoordinator finds a group coordinator and a transaction coordinator.
//
// The last step makes the broker create __consumer_offsets and
// __transaction_state, so the first test that uses a group or a transaction
// does not pay for it (or time out waiting for it).
//
// Usage:
//
//	kafkaready -brokers 127.0.0.1:19092 [-timeout 3s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", os.Getenv("TIDEMARK_KAFKA_BROKERS"), "comma-separated seed brokers")
	timeout := flag.Duration("timeout", 3*time.Second, "bound of the whole attempt")
	flag.Parse()
	if *brokers == "" {
		fmt.Fprintln(os.Stderr, "kafkaready: no brokers: pass -brokers or set TIDEMARK_KAFKA_BROKERS")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := check(ctx, strings.Split(*brokers, ",")); err != nil {
		fmt.Fprintf(os.Stderr, "kafkaready: %s: %v\n", *brokers, err)
		os.Exit(1)
	}
}

func check(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DialTimeout(time.Second),
		// One attempt: the caller's loop does the retrying and watches the
		// broker process meanwhile.
		kgo.RequestRetries(0),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if len(md.Brokers) == 0 {
		return errors.New("metadata: no broker registered yet")
	}
	if md.Controller < 0 {
		return errors.New("metadata: no controller yet")
	}

	created, err := adm.ValidateCreateTopics(ctx, 1, 1, nil, "tidemark-ready-probe")
	if err != nil {
		return fmt.Errorf("validate create topic: %w", err)
	}
	if err := created.Error(); err != nil {
		return fmt.Errorf("validate create topic: %w", err)
	}

	if err := adm.FindGroupCoordinators(ctx, "tidemark-ready-probe").Error(); err != nil {
		return fmt.Errorf("group coordinator: %w", err)
	}
	if err := adm.FindTxnCoordinators(ctx, "tidemark-ready-probe").Error(); err != nil {
		return fmt.Errorf("transaction coordinator: %w", err)
	}
	return nil
}
