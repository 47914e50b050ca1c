// Package runner is tidemark's engine: one poll goroutine owns the partition
// table and hands immutable records to ordered lanes (per key, per
// partition, or unordered) run by a bounded worker pool, and commits only
// the contiguous prefix of delivered records that are complete.
//
// A Runner is built over a Source (the franz-go adapter in
// pkg/source/franz is the reference one) with New, handlers registered per
// topic with Handle, and run with Run:
//
//	r, err := runner.New(src,
//		runner.Handle("orders", handleOrder),
//		runner.Concurrency(256),
//		runner.Failure(runner.DeadLetter("orders.dlq", 5, nil)),
//	)
//	if err != nil { ... }
//	go func() { <-sigterm; r.Shutdown(ctxWithBudget) }()
//	err = r.Run(ctx)
//
// What a user must know:
//
//   - Delivery is at least once. A record can run again after a revoke, a
//     lost partition, a crash or a drain that ran out of time; make effects
//     idempotent (pkg/inbox does it in PostgreSQL).
//   - Handlers must honour their ctx: it is cancelled when the partition is
//     lost, when a drain runs past its budget, and on Close. Run waits for
//     every handler to return before it returns.
//   - A failing record is retried with backoff and holds its key (or its
//     partition, in PartitionOrder) and the partition's commit until it
//     succeeds, unless the failure policy dead-letters or skips it.
//   - Each partition is paused when its buffered plus in-flight records or
//     bytes reach the high water mark, or its uncommitted window (Window)
//     is full behind a record that does not finish, and resumed at the low
//     marks. MaxBufferedBytes bounds the whole consumer: the runner charges
//     each record its copied payload plus RecordOverhead and keeps within
//     its share; PartitionOverhead per owned partition comes on top.
package runner
