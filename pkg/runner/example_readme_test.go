package runner_test

// The code between "snippet: readme" and "end snippet" lines is README.md's
// "A handler" example (TestDocSnippets keeps the two the same, and
// TestReadmeProgramBuilds builds the README's block alone as a main
// package), run here against a fake one-broker cluster (kfake).

// snippet: readme
import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// end snippet

import (
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// snippet: readme

type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

func main() {
	// SIGINT (Ctrl-C) or SIGTERM ends ctx. Run then stops gracefully:
	// it stops fetching, lets running handlers finish (within
	// DrainBudget), commits what is done and leaves the group.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	brokers := strings.Split(os.Getenv("TIDEMARK_KAFKA_BROKERS"), ",")
	if err := run(ctx, brokers, applyOrder); err != nil {
		log.Fatal(err)
	}
}

// run consumes the topic "orders" until ctx ends, calling apply for each
// order.
func run(ctx context.Context, brokers []string, apply func(context.Context, Order) error) error {
	src, err := franz.New(brokers, "orders-svc", []string{"orders"})
	if err != nil {
		return err
	}
	r, err := runner.New(src,
		runner.Handle("orders", runner.Chain(
			// Each value decoded as JSON into an Order; one that does not
			// decode is a permanent failure: dead-lettered at once.
			runner.Typed(runner.JSON[Order](), func(ctx context.Context, rec runner.Record, o Order) error {
				// nil marks the record done. Honour ctx: it is
				// cancelled when the partition is lost.
				return apply(ctx, o)
			}),
			runner.LogFailures(slog.Default()), // each failed attempt, at warn
			runner.Timeout(5*time.Second),      // per attempt, on this topic
		)),
		runner.Order(runner.KeyOrder), // the default
		runner.Concurrency(256),
		runner.Failure(runner.DeadLetter("orders.dlq", 5, nil)),
	)
	if err != nil {
		return err // *runner.ConfigError names the option
	}
	return r.Run(ctx)
}

// applyOrder is the effect: write to a database, call a service. It may
// run again for the same order (at least once); make it idempotent, or
// use the inbox (below).
func applyOrder(ctx context.Context, o Order) error {
	slog.InfoContext(ctx, "order", "id", o.ID, "customer", o.Customer, "cents", o.Cents)
	return nil
}

// end snippet

// The README's handler example, over a fake cluster holding three orders:
// once the three are applied, ctx ends — as it does on SIGTERM in main —
// and Run stops gracefully.
func Example_readme() {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	produce(c.ListenAddrs(), "orders",
		`{"id":"o-1","customer":"c-1","cents":1250}`,
		`{"id":"o-2","customer":"c-2","cents":990}`,
		`{"id":"o-3","customer":"c-1","cents":300}`,
	)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var applied []string
	apply := func(ctx context.Context, o Order) error {
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, fmt.Sprintf("%s %s %d", o.ID, o.Customer, o.Cents))
		if len(applied) == 3 {
			cancel() // what SIGTERM does to main's ctx
		}
		return nil
	}
	if err := run(ctx, c.ListenAddrs(), apply); err != nil {
		log.Fatal(err)
	}
	slices.Sort(applied)
	for _, a := range applied {
		fmt.Println(a)
	}
	// Output:
	// o-1 c-1 1250
	// o-2 c-2 990
	// o-3 c-1 300
}

// produce writes values to topic, keyed by their order in the list.
func produce(brokers []string, topic string, values ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for i, v := range values {
		r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte(v)}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
}
