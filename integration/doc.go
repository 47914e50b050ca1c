// Package integration holds tidemark's tests against a real Kafka broker and
// a real PostgreSQL server. Every test file carries the build tag
// `integration`, so plain `go test ./...` compiles none of them.
//
// Run them with the project's test bed:
//
//	scripts/testbed up && source .testbed/env
//	go test -race -count=1 -tags integration ./integration/...
//
// or simply `make test`, which also stops the bed afterwards. The tests read
// the addresses from TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN; when either
// is missing or does not answer, they FAIL with a message saying how to start
// the bed. They never skip. The helpers they share are in package bed.
package integration
