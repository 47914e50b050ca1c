package inbox_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// The wiring of a service: the Store's handler for the topic, its assign
// hook on the runner, and retention on a goroutine of its own.
func Example() {
	ctx := context.Background()
	var (
		src       runner.Source       // e.g. franz.New(brokers, "orders-svc", []string{"orders"})
		committed inbox.CommittedFunc // e.g. kadm FetchOffsets for "orders-svc"
	)
	pool, err := pgxpool.New(ctx, "postgres://app@db/orders")
	if err != nil {
		log.Fatal(err)
	}
	store, err := inbox.New(pool, "orders-svc", inbox.Batch(32), inbox.BatchWait(200*time.Microsecond))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Check(ctx); err != nil { // or store.Migrate(ctx)
		log.Fatal(err)
	}
	r, err := runner.New(src,
		runner.Handle("orders", store.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
			_, err := tx.Exec(ctx, "INSERT INTO orders (id, body) VALUES ($1, $2) ON CONFLICT DO NOTHING", rec.Key, rec.Value)
			return err
		})),
		runner.OnAssign(store.AssignHook()),
		runner.Concurrency(256),
	)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = store.RunRetention(ctx, time.Minute, committed) }()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A batch handler: one transaction per batch of one partition's records,
// the records applied before taken out first. Register it with the
// runner's HandleBatch. RetainFor keeps a week of rows, so dead letters
// redriven within a week (`tidemark dlt replay`) are decided from them.
func ExampleStore_BatchHandler() {
	var pool *pgxpool.Pool // pgxpool.New(ctx, dsn)
	store, err := inbox.New(pool, "orders-svc", inbox.RetainFor(7*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	var h runner.BatchHandler = store.BatchHandler(func(ctx context.Context, tx pgx.Tx, recs []runner.Record) error {
		rows := make([][]any, len(recs))
		for i, r := range recs {
			rows[i] = []any{r.Key, r.Value}
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id", "body"}, pgx.CopyFromRows(rows))
		return err
	})
	_ = h
}
