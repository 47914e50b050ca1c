// Command tidemark is tidemark's command-line tool.
//
// Usage:
//
//	tidemark lab offsets [--case normal|stale|handoff | --script FILE] [--strategy prefix|naive] [--json]
//	tidemark inbox migrate --dsn DSN [--schema NAME] [--timeout D]
//	tidemark inbox leases --group G [--topic T] [--reset --yes] [--dsn DSN]
//	tidemark dlt replay --from TOPIC.dlt --to TOPIC [--origin-topic T|*] [--partition N]
//		[--offsets FROM-TO] [--error TEXT] [--header KEY[=VALUE]]... [--group G] [--dry-run] [--brokers B]
//
// `lab offsets` replays a trace of one partition's assignments, deliveries,
// completions and revokes and prints, step by step, the offset that is safe
// to commit (see docs/watermark.md). It exits with status 2 for a malformed
// script and 1 for any other error.
//
// `inbox migrate` creates or upgrades the PostgreSQL tables of pkg/inbox
// (see docs/inbox.md). It is idempotent and safe to run from many replicas
// at once; it exits with status 1 on any error. `inbox leases` lists a
// group's partition leases and, with --reset --yes, bumps them.
//
// `dlt replay` redrives dead letters: it reads the dead-letter topic
// --from (from the beginning, or from --group's committed offsets) up to
// its end when it starts, and republishes the records chosen — by default
// those whose tidemark-origin-topic is --to, narrowed by --partition,
// --offsets (of the origin), --error (a substring of the error or its
// type) and --header — to --to, with their key and value, the origin
// headers kept and the failure headers (tidemark-error*, -attempts,
// -first/last-failure, -group) dropped; acks=all, idempotent. pkg/inbox
// recognises a republished record by its origin, so a replay of a record
// that was applied, or replayed before, applies nothing. With --group it
// commits what it read once everything chosen is acknowledged, so the next
// replay with that group starts after it; --dry-run lists and changes
// nothing. The brokers are --brokers, else $TIDEMARK_KAFKA_BROKERS. It
// exits with status 1 on any error (nothing is committed then; records
// already sent were sent).
package main
