// Package chaos is tidemark's chaos suite: several processes of the orders
// example (examples/orders) consume one topic in one group while producers
// keep writing, and at random moments one consumer is killed with SIGKILL,
// another stopped with SIGTERM, new ones are started, one is frozen with
// SIGSTOP past its session timeout, and the Kafka broker and PostgreSQL are
// restarted. Each consumer connects through loopback proxies of its own
// (internal/tcpproxy), so one consumer alone can be cut off from Kafka while
// it keeps PostgreSQL (a zombie, whose effects the inbox must fence), cut
// off from PostgreSQL, slowed down, or have its broker connections reset;
// and partitions are added to the topic while it is consumed. On a bed of
// three Kafka nodes (TIDEMARK_KAFKA_NODES=3 scripts/testbed up, or make soak
// CLUSTER=3) the leader of a consumed partition and the group's coordinator
// are killed too, the nodes restarted one by one, and a leader frozen past
// the broker session timeout. At the end
// every record must have been applied exactly once
// (inbox rows and effects, against the topic read back), each key's effects
// in offset order within its partition, no committed offset may ever have
// gone backward, and no inbox row may have committed after its partition's
// lease moved to a newer owner. The run reports the faults it survived and
// the recovery time per kind of fault.
//
// With -mode share (or TIDEMARK_CHAOS_MODE=share) the consumers form a
// share group instead (examples/orders -mode share, a 3 s lock): the same
// faults and the same lost and duplicated checks, progress read from the
// share-partition lag, and no key-order or backward-commit check (a share
// group promises no order and commits no offsets):
//
//	go test -count=1 -tags integration ./integration/chaos/ -mode share
//
// The tests carry the build tag `integration` and need the project's own test
// bed, because they restart its services (through internal/testbed, in the
// test process; it checks that the bed's state names the servers of
// TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN):
//
//	scripts/testbed up && source .testbed/env
//	go test -race -count=1 -tags integration ./integration/chaos/
//
// Do not run them at the same time as other integration tests on the same
// bed: the broker and database restarts would fail those. `make test` runs
// this package after the others; `make soak DURATION=10m` runs it alone for
// longer. docs/chaos.md has the details and the environment variables
// (TIDEMARK_CHAOS_DURATION, TIDEMARK_CHAOS_SEED, TIDEMARK_CHAOS_SUMMARY, …).
package chaos
