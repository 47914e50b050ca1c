// Command tidemark is tidemark's command-line tool.
//
// Usage:
//
//	tidemark lab offsets [--case normal|stale|handoff | --script FILE] [--strategy prefix|naive] [--json]
//	tidemark inbox migrate --dsn DSN [--schema NAME] [--timeout D]
//	tidemark inbox leases --group G [--topic T] [--reset --yes] [--dsn DSN]
//	tidemark dlt replay --from TOPIC.dlt --to TOPIC [--origin-topic T|*] [--partition N]
//		[--offsets FROM-TO] [--error TEXT] [--header KEY[=VALUE]]... [--group G] [--dry-run] [--brokers B]
//	tidemark version
//	tidemark help [COMMAND [SUB-COMMAND]]
//
// Every command and sub-command takes -h (or --help): its usage, on
// stdout, exit status 0. The exit status is the same for all: 0 when the
// command did what was asked; 2 for a usage error — an unknown command,
// sub-command or flag, a missing one, a bad flag value, a setting missing
// from the environment (no --dsn nor TIDEMARK_PG_DSN, no brokers), a
// malformed connection string or broker list (each broker host:port, with
// a port of 1 to 65535, no empty entry), a malformed lab script —, found before anything was done, with a message
// on stderr saying what was wrong; 1 when the command ran and failed (a
// file it cannot read, a database or broker that fails or is unreachable),
// with the reason on stderr.
//
// `lab offsets` replays a script of one partition's assignments,
// deliveries, completions and revokes and prints, step by step, the offset
// that is safe to commit (see docs/watermark.md).
//
// `inbox migrate` creates or upgrades the PostgreSQL tables of pkg/inbox
// (see docs/inbox.md). It is idempotent and safe to run from many replicas
// at once. `inbox leases` lists a group's partition leases and, with
// --reset --yes, bumps them; --reset without --yes lists them and exits 2,
// changing nothing.
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
// nothing. The brokers are --brokers, else $TIDEMARK_KAFKA_BROKERS. On a
// failure (status 1) nothing is committed; records already sent were sent.
//
// `version` prints the module version from the binary's build information
// and, when the build recorded it, the VCS revision: "tidemark v1.2.3
// go1.26.8" after `go install ...@v1.2.3`; after `go build` in a git
// checkout a pseudo-version and "(revision REV, TIME[, modified])"; after
// `go run`, or a build with -buildvcs=false, "tidemark (devel) go1.26.8".
package main
