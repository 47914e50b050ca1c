// Package bed gives integration tests the test bed's Kafka broker and
// PostgreSQL server: a unique topic per test, keyed records produced with
// franz-go, a group's committed offsets and members, and a pgx pool on a
// schema of the test's own. Everything a helper creates is removed in the
// test's cleanup.
//
// The helpers are compiled only with the build tag `integration` (this file
// is untagged so the package documentation is always visible). Each takes a
// testing.TB and fails the test with t.Fatalf when the bed is missing or
// broken: a missing service is a failed test, never a skipped one. Start the
// bed with
//
//	scripts/testbed up && source .testbed/env
//
// which exports TIDEMARK_KAFKA_BROKERS (comma-separated host:port) and
// TIDEMARK_PG_DSN (a PostgreSQL URL). Any Kafka 4.x and PostgreSQL 15+ will
// do; docs/testbed.md says how to point the variables at your own.
//
// The helpers are safe for parallel tests: names are unique per call.
package bed
