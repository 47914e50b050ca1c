// Package franz is tidemark's reference source: a runner.Source over
// github.com/twmb/franz-go that joins a Kafka consumer group, hands fetched
// records to the runner, reports revoked and lost partitions, pauses
// partitions at the runner's high water marks and commits the runner's safe
// offsets. It also writes dead letters (runner.DeadLetterWriter).
//
//	src, err := franz.New(brokers, "orders-svc", []string{"orders"},
//		franz.InstanceID(os.Getenv("POD_NAME")))
//	if err != nil { ... }
//	r, err := runner.New(src, runner.Handle("orders", handle))
//
// What a user must know:
//
//   - Rebalances are cooperative by default (cooperative-sticky): a member
//     keeps consuming what it keeps, and only moved partitions are revoked.
//     Every member of a group must use the same protocol; see Balancer and
//     Eager.
//   - A revoke blocks the rebalance while the runner drains the revoked
//     partitions' in-flight handlers and commits their safe offsets;
//     franz-go keeps heartbeating meanwhile. The drain is bounded by the
//     runner's DrainBudget and by half the RebalanceTimeout, whichever is
//     shorter, so keep DrainBudget well below RebalanceTimeout (defaults
//     10s and 60s). A member that takes longer is removed from the group and
//     its partitions are lost: nothing more is committed for them and their
//     handlers' contexts are cancelled.
//   - After a loss the adapter commits nothing for the lost partitions, even
//     if franz-go has already rejoined the group with a new generation (the
//     broker would accept such a commit in the classic protocol).
//   - Static membership (InstanceID) lets a restart within the session
//     timeout keep its partitions without a rebalance; Close then does not
//     leave the group.
//   - The transaction markers of transactional topics are read but never
//     delivered: they move the committed offset to the end of the partition,
//     so lag reaches zero. Records of aborted transactions are never
//     delivered (read_committed).
//   - What the source holds for fetched records stays within its share of
//     runner.MaxBufferedBytes, for records of the shape runner.RecordShape
//     states: runner.New calls LimitFetch, which sets the client's fetch
//     sizes from them (replacing kgo.FetchMaxBytes and
//     kgo.FetchMaxPartitionBytes given in ClientOptions). Each of the
//     client's concurrent fetches (kgo.MaxConcurrentFetches, default 3) gets
//     its part; on a single broker, 1 gives three times larger fetches.
//     docs/adapters.md has the formula.
//   - ServerSideAssignment turns on the KIP-848 protocol (the broker
//     assigns). It needs Kafka 4.0+, and franz-go recommends 4.3+ (earlier
//     brokers can fail a commit with STALE_MEMBER_EPOCH during
//     reconciliation; the runner retries it). The classic protocol is the
//     default; tidemark's real-broker tests cover the classic protocol
//     (cooperative, eager, static) and test KIP-848 against kfake only.
package franz
