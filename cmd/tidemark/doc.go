// Command tidemark is tidemark's command-line tool.
//
// Usage:
//
//	tidemark lab offsets [--case normal|stale|handoff | --script FILE] [--strategy prefix|naive] [--json]
//	tidemark inbox migrate --dsn DSN [--schema NAME] [--timeout D]
//
// `lab offsets` replays a trace of one partition's assignments, deliveries,
// completions and revokes and prints, step by step, the offset that is safe
// to commit (see docs/watermark.md). It exits with status 2 for a malformed
// script and 1 for any other error.
//
// `inbox migrate` creates or upgrades the PostgreSQL tables of pkg/inbox
// (see docs/inbox.md). It is idempotent and safe to run from many replicas
// at once; it exits with status 1 on any error.
package main
