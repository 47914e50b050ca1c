// Package share is a runner.Source over franz-go's share consumer (KIP-932
// share groups, "queues for Kafka"): any number of members read the same
// partitions, and the broker hands each record to one member at a time
// under an acquisition lock and counts its deliveries. The source settles
// every record on its own (runner.Settler): accepted once its handler
// finished, rejected when the failure policy gave up, released when it did
// not finish here. There is no order across the group, no commit, no
// revoke and no partition owner.
//
//	src, err := share.New(brokers, "orders-workers", []string{"orders"},
//		share.GroupConfig("share.auto.offset.reset", "earliest"))
//	if err != nil { ... }
//	r, err := runner.New(src, runner.Handle("orders", handle),
//		runner.Failure(runner.DeadLetter("orders.dlt", 5, nil)))
//
// What a user must know:
//
//   - franz-go accepts, at the next poll, every record of the previous poll
//     that has no terminal ack. So each of the source's sessions (Sessions,
//     separate clients) polls again only once the runner has settled every
//     record of its previous poll; a slow record stalls its own session,
//     not the others. While records are unsettled the session renews their
//     locks (AckRenew, Kafka 4.2+).
//   - Records are delivered at least once: an expired lock, a dropped
//     connection or a lost ack delivers a record again, to any member.
//     Make effects idempotent (pkg/inbox).
//   - share.auto.offset.reset, a group config, defaults to "latest": a new
//     group sees only records produced after it first consumed. Set it with
//     GroupConfig.
//   - runner.New refuses, over this source, the runner options that mean
//     nothing here (KeyOrder, PartitionOrder, Block, commit settings,
//     Window, OnAssign); the default order is Unordered.
//
// The package Example runs a whole consumer, against a fake cluster.
// docs/share.md says exactly what is promised and what is not.
package share
