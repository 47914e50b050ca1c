// Package inbox gives exactly-once business effects on top of tidemark's
// at-least-once delivery: each record's effect is written in the same
// PostgreSQL transaction as an inbox row keyed by (group, topic, partition,
// offset), so a replay finds the row and does nothing.
//
// Not built yet: see the project's issue on pkg/inbox.
package inbox
