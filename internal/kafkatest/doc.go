// Package kafkatest is the one test-support layer of tidemark's Kafka
// tests: a Cluster (an in-process kfake cluster, or the test bed's real
// broker, behind the same methods) that creates topics, produces records
// and reads end and committed offsets through kadm; a Sampler that watches
// a group's committed offsets for one going backward; a Spy that records
// the ownership a Source reports to its runner; a Member that runs a
// runner over a spied Source; a Ledger of the records handled, by whom
// and how often; the test Logger; and WaitFor.
//
// What a caller must know:
//
//   - Every helper takes a testing.TB and fails the test with t.Fatalf when
//     Kafka answers with an error: call them from the test's goroutine. A
//     missing broker is a failed test, never a skipped one.
//   - Everything a helper creates (clients, topics, the kfake cluster, a
//     Sampler's goroutine, a Member) is closed or removed in the test's
//     cleanup.
//   - An offset is the next one to consume: Committed returns -1 for a
//     partition without a commit, and a group that consumed a whole
//     partition has committed its end offset (see AtEnd).
package kafkatest
