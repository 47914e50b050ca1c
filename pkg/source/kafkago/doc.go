// Package kafkago is a tidemark source over github.com/segmentio/kafka-go,
// for services that already run on kafka-go: a runner.Source that joins a
// consumer group through kafka-go's ConsumerGroup, fetches each assigned
// partition itself, hands the records to the runner, and commits the
// runner's safe offsets with the generation that assigned the partitions.
// It also writes dead letters (runner.DeadLetterWriter).
//
//	src, err := kafkago.New(brokers, "orders-svc", []string{"orders"},
//		kafkago.SessionTimeout(30*time.Second))
//	if err != nil { ... }
//	r, err := runner.New(src, runner.Handle("orders", handle))
//
// Prefer pkg/source/franz when you can choose: kafka-go's group support
// has hard limits. What a user must know:
//
//   - EAGER REBALANCES ONLY. kafka-go has no cooperative protocol and no
//     KIP-848: every join, leave or partition-count change revokes every
//     partition of every member, and the whole group stops consuming until
//     the slowest member has drained its in-flight handlers and committed.
//     A franz member can share the group only with an eager strategy both
//     offer (kgo.RangeBalancer), which makes the whole group eager.
//   - NO HEARTBEATS WHILE A REVOKE DRAINS. kafka-go heartbeats from a
//     goroutine of the generation that has just ended, so the drain is
//     bounded by (min(SessionTimeout, RebalanceTimeout) − HeartbeatInterval)
//     / 2 (21s with the defaults), and by the runner's DrainBudget if that
//     is shorter. Handlers still running then are cancelled and their
//     records are replayed by the next owner. A member that stalls longer
//     is removed from the group.
//   - NO STATIC MEMBERSHIP. Close always leaves the group, and every
//     restart (a deploy) is two rebalances of the whole group.
//   - A rebalance is noticed at the next heartbeat, up to HeartbeatInterval
//     late.
//   - kafka-go never reports a lost session. The adapter learns of it when
//     the coordinator refuses a commit with ILLEGAL_GENERATION,
//     UNKNOWN_MEMBER_ID or REBALANCE_IN_PROGRESS, reports the generation's
//     partitions lost (the runner cancels their handlers and commits
//     nothing more for them) and rejoins. Every commit carries the member
//     id and generation that assigned its partitions, never a later one, so
//     the coordinator refuses a commit of a member that was removed.
//   - It does not use kafka.Reader: with IsolationLevel ReadCommitted a
//     Reader still returns the records of aborted transactions and the
//     transaction markers themselves (as messages with a 4-byte key), as
//     checked against Kafka 4.1, and kafka-go's record decoders drop a
//     batch's last offset. Each partition has a fetcher that sends fetch
//     requests through a kafka.Transport, read_committed, reads the record
//     batches itself and drops markers and aborted records; its position
//     moves past them and past each batch's last offset, so the committed
//     offset reaches the end of a transactional partition, and of a
//     compacted one whose batches lost their last records (lag 0).
//   - Each partition has one fetch at a time: its fetcher fetches again
//     once the runner took all of the last one. What the fetchers bring
//     waits in one queue, and each hand-over to the runner carries as many
//     partitions as the runner's budget covers. Pause stops handing a
//     partition over and fetching it; what its fetcher holds is kept, and
//     Resume hands it over first. Beyond the runner's water marks the
//     adapter holds at most one fetch per partition; runner.New sizes the
//     fetches (LimitFetch) so that all of them, decoded, fit the adapter's
//     share of runner.MaxBufferedBytes under runner.RecordShape's
//     assumptions. That share is divided among the partitions assigned.
//   - A committed offset that fell out of the log (retention) restarts at
//     the log start, logged at error level; StartOffset applies only to
//     partitions with no committed offset.
//   - Dead letters go through a kafka.Writer with RequiredAcks all. It is
//     not idempotent: a retried write can store a dead letter twice.
//
// The two adapters side by side (pkg/source/sourcetest checks the rebalance,
// static membership, pause, loss and transaction rows on a real broker,
// with a capability subtest where the adapters differ):
//
//	                               franz                        kafkago
//	rebalance protocol             cooperative-sticky (default) eager only
//	                               or eager; KIP-848 opt-in
//	during a rebalance             only moved partitions stop   the whole group stops
//	heartbeats during a drain      yes (drain ≤ Rebalance/2)    no (drain bounded as above)
//	static membership (KIP-345)    yes (InstanceID)             no
//	pause                          PauseFetchPartitions         the fetcher stops, keeps its fetch
//	lost session reported          on a heartbeat error         on a refused commit
//	transactions (read_committed)  yes, lag reaches 0           yes, lag reaches 0
//	compacted batches' tails       lag reaches 0                lag reaches 0
//	dead letters                   idempotent producer          acks=all, not idempotent
package kafkago
