package share_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// A share-group consumer: the same handler API as over a consumer group.
// Run as many processes as you like in the group "orders-workers", whatever
// the number of partitions; the broker hands each record to one of them at
// a time. Here a fake one-broker cluster (kfake) with three orders stands in
// for your brokers.
func Example() {
	brokers, stopCluster := fakeCluster("orders", "order-1", "order-2", "order-3")
	defer stopCluster()

	src, err := share.New(brokers, "orders-workers", []string{"orders"},
		// A group config: the default, latest, would skip every record
		// produced before the group first consumed.
		share.GroupConfig("share.auto.offset.reset", "earliest"))
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var handled []string
	all := make(chan struct{})
	r, err := runner.New(src,
		runner.Handle("orders", func(ctx context.Context, rec runner.Record) error {
			// Delivered at least once, to any member, in no order: make the
			// effect idempotent (pkg/inbox). DeliveryCount is the broker's
			// count, 1 on a first delivery.
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, fmt.Sprintf("%s (delivery %d)", rec.Value, rec.DeliveryCount))
			if len(handled) == 3 {
				close(all)
			}
			return nil // the record is accepted (ACCEPT) once this returns
		}),
		// Block, the default policy, is refused over a share source: after
		// 5 failed attempts the source writes the record to orders.dlt
		// (nil: the source is the writer), then accepts it.
		runner.Failure(runner.DeadLetter("orders.dlt", 5, nil)),
	)
	if err != nil {
		log.Fatal(err) // a *runner.ConfigError names an option refused here
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()

	<-all // in a service: until SIGTERM
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Stop polling, let in-flight records finish and settle them, release
	// what is left, flush the acks and leave the group.
	if err := r.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	slices.Sort(handled)
	for _, h := range handled {
		fmt.Println(h)
	}
	// Output:
	// order-1 (delivery 1)
	// order-2 (delivery 1)
	// order-3 (delivery 1)
}

// fakeCluster starts a kfake cluster with a one-partition topic holding
// values and returns its addresses and a func that stops it.
func fakeCluster(topic string, values ...string) ([]string, func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		log.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	return c.ListenAddrs(), c.Close
}
