// Command produce writes N order events to the orders topic at a chosen
// rate, keyed by customer, for the orders example. Amounts are a pure
// function of the order number, so anyone can recompute the expected totals
// from the topic.
//
//	produce -brokers 127.0.0.1:19092 -topic orders -create -partitions 12 -n 100000 -rate 0
package main

import (
	"context"
	"encoding/json"
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
	brokers := flag.String("brokers", os.Getenv("TIDEMARK_KAFKA_BROKERS"), "Kafka seed brokers (default $TIDEMARK_KAFKA_BROKERS)")
	topic := flag.String("topic", "orders", "topic")
	n := flag.Int("n", 100_000, "orders to write")
	start := flag.Int("start", 0, "number of the first order (ids are order-<number>)")
	customers := flag.Int("customers", 1000, "distinct customers")
	rate := flag.Float64("rate", 0, "orders per second; 0 means as fast as possible")
	create := flag.Bool("create", false, "create the topic if it does not exist")
	partitions := flag.Int("partitions", 12, "partitions when creating the topic")
	flag.Parse()
	if err := run(*brokers, *topic, *n, *start, *customers, *rate, *create, *partitions); err != nil {
		fmt.Fprintln(os.Stderr, "produce:", err)
		os.Exit(1)
	}
}

// Amount is order i's amount in cents.
func Amount(i int) int64 { return int64(100 + (i*7919)%10000) }

// Customer is order i's customer.
func Customer(i, customers int) string { return fmt.Sprintf("customer-%04d", (i*31)%customers) }

func run(brokers, topic string, n, start, customers int, rate float64, create bool, partitions int) error {
	switch {
	case brokers == "":
		return errors.New("no brokers: set -brokers or TIDEMARK_KAFKA_BROKERS")
	case n < 0 || customers < 1 || rate < 0 || partitions < 1:
		return errors.New("-n, -rate must not be negative; -customers and -partitions must be positive")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx := context.Background()
	if create {
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), -1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
			return fmt.Errorf("creating %s: %w", topic, err)
		}
	}
	var every time.Duration
	if rate > 0 {
		every = time.Duration(float64(time.Second) / rate)
	}
	errc := make(chan error, 1)
	began := time.Now()
	for i := start; i < start+n; i++ {
		c := Customer(i, customers)
		v, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("order-%d", i), "customer": c, "amount_cents": Amount(i)})
		cl.Produce(ctx, &kgo.Record{Key: []byte(c), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
		if every > 0 {
			if d := time.Until(began.Add(time.Duration(i-start+1) * every)); d > 0 {
				time.Sleep(d)
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errc:
		return fmt.Errorf("producing: %w", err)
	default:
	}
	fmt.Printf("produced %d orders to %s in %s\n", n, topic, time.Since(began).Round(time.Millisecond))
	return nil
}
