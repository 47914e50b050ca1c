// Package inbox gives exactly-once business effects on top of tidemark's
// at-least-once delivery, in PostgreSQL: each record's effect commits in the
// same transaction as an inbox row keyed by (group, topic, partition,
// offset), so a replay of the record finds the row and does nothing; and
// each partition has a lease whose epoch every assignment bumps, so a
// worker of an old assignment cannot commit an effect once the partition
// has moved on.
//
//	store, err := inbox.New(pool, "orders-svc")
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... } // or `tidemark inbox migrate --dsn …`
//	r, err := runner.New(src,
//		runner.Handle("orders", store.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
//			_, err := tx.Exec(ctx, "INSERT INTO orders ...", ...)
//			return err
//		})),
//		runner.OnAssign(store.AssignHook()),
//	)
//	go store.RunRetention(ctx, time.Minute, committedOffsets) // one goroutine, any replica
//
// What a user must know:
//
//   - Both halves are needed: Handler without runner.OnAssign(store.AssignHook())
//     fails every record with ErrNoLease. Give each member its own Store.
//   - Only what the Effect writes through its pgx.Tx is exactly once. An
//     HTTP call, an email or a Kafka produce made inside it is not rolled
//     back and happens again on a replay.
//   - A replay is detected by the record's own offset (and by DedupKey, when
//     set, across offsets), so the inbox needs the Kafka offsets to stay
//     meaningful: after deleting and recreating a topic, start a new group.
//   - Rows are deleted only by Prune or RunRetention, which need the group's
//     committed offsets (CommittedFunc); without them the inbox grows by one
//     row per record. What retention deleted stays applied: a partition's
//     applied mark makes every record below it a replay, also when the
//     group's committed offsets expire and it starts from the earliest.
//   - Pass the member's Source with Owners: a lease bump that reaches the
//     database late from an assignment that ended would otherwise leave
//     the partition's real owner fenced until its next assignment.
//   - An effect that only sends statements can be a QueuedEffect
//     (QueuedHandler): a batch of them is one pipeline, about three round
//     trips whatever its size.
//   - A runner batch handler (HandleBatch) gets BatchHandler: one
//     transaction per batch, the replays taken out before the BatchEffect.
//   - A redriven dead letter (`tidemark dlt replay`) is deduplicated
//     against its origin record too, by its tidemark-origin-* headers; an
//     origin below its partition's applied mark with its row pruned is
//     refused (OriginBelowMarkError, permanent): keep rows with RetainFor
//     for as long as you may redrive.
//   - An error that means PostgreSQL cannot be used is an
//     UnavailableError, marked runner.Transient: the runner retries it
//     without counting, so an outage does not dead-letter good records.
//
// docs/inbox.md explains the model, the schema and why the fencing holds.
package inbox
