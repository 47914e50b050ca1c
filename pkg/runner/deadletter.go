package runner

// The headers the runner adds to every dead-letter record, after the
// original record's own headers (which it keeps, in order). Values are
// text: numbers in decimal, times in RFC 3339 with nanoseconds (UTC), the
// key as its bytes. Spring Kafka's kafka_dlt-* headers are the model; the
// names are tidemark's. A record dead-lettered twice (redriven, then failed
// again) carries the first origin: the origin headers of a record that
// already has them are kept and not added again, so a redrive always goes
// back to, and deduplicates against, the record first consumed.
const (
	// HeaderOriginTopic, HeaderOriginPartition and HeaderOriginOffset
	// name the record that failed: together they are its identity, which
	// `tidemark dlt replay` and pkg/inbox use to recognise a redriven record.
	HeaderOriginTopic     = "tidemark-origin-topic"
	HeaderOriginPartition = "tidemark-origin-partition"
	HeaderOriginOffset    = "tidemark-origin-offset"
	// HeaderOriginTimestamp is the failed record's timestamp.
	HeaderOriginTimestamp = "tidemark-origin-timestamp"
	// HeaderOriginKey is the failed record's key; absent for a nil key.
	// (The dead-letter record keeps the key as its own key too; the header
	// survives a redrive that re-keys.)
	HeaderOriginKey = "tidemark-origin-key"
	// HeaderGroup is the consumer group (or share group) of the runner
	// that dead-lettered it, when the source names one.
	HeaderGroup = "tidemark-group"
	// HeaderErrorType is the Go type of the last error (for example
	// "*fmt.wrapError", "*runner.PanicError"), or of the error it wraps
	// when the runner's own marks (Permanent, Transient) are outermost.
	HeaderErrorType = "tidemark-error-type"
	// HeaderError is the last error's message.
	HeaderError = "tidemark-error"
	// HeaderErrorKind is how the policy counted the last error:
	// "retryable", "transient" or "permanent".
	HeaderErrorKind = "tidemark-error-kind"
	// HeaderAttempts is the number of attempts made.
	HeaderAttempts = "tidemark-attempts"
	// HeaderFirstFailure and HeaderLastFailure are when the first and the
	// last failed attempt ended.
	HeaderFirstFailure = "tidemark-first-failure"
	HeaderLastFailure  = "tidemark-last-failure"
)
