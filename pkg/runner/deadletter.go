package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// The headers the runner adds to every dead-letter record, after the
// original record's own headers (which it keeps, in order). Values are
// text: numbers in decimal, times in RFC 3339 with nanoseconds (UTC), the
// key as its bytes. Spring Kafka's kafka_dlt-* headers are the model; the
// names are tidemark's. A record dead-lettered twice (redriven, then failed
// again) carries the first origin: the origin headers of a record that
// already has a whole origin (topic, partition and offset) are kept and
// not added again, so a redrive always goes back to, and deduplicates
// against, the record first consumed; a partial origin is replaced.
const (
	// HeaderOriginTopic, HeaderOriginPartition and HeaderOriginOffset
	// name the record that failed: together they are its identity, which
	// `tidemark dlt replay` and pkg/inbox use to recognise a redriven record.
	HeaderOriginTopic     = "tidemark-origin-topic"
	HeaderOriginPartition = "tidemark-origin-partition"
	HeaderOriginOffset    = "tidemark-origin-offset"
	// HeaderOriginTimestamp is the failed record's timestamp.
	HeaderOriginTimestamp = "tidemark-origin-timestamp"
	// HeaderOriginKeySHA256 is the hex SHA-256 of the failed record's key
	// when the key is longer than MaxOriginKeyHeader, in place of
	// HeaderOriginKey: a header copying a large key could make the dead
	// letter too large for the broker.
	HeaderOriginKeySHA256 = "tidemark-origin-key-sha256"
	// HeaderDeadLetterCut says what a dead letter lacks of the failed
	// record because the broker refused the whole one (too large or
	// invalid, see RefusedError): "value,headers" (its value and its own
	// headers), or "value,headers,key". `tidemark dlt replay` does not
	// replay such a dead letter.
	HeaderDeadLetterCut = "tidemark-dead-letter-cut"
	// HeaderDeadLetterRefused is the broker's refusal of the fuller dead
	// letter, when HeaderDeadLetterCut is there.
	HeaderDeadLetterRefused = "tidemark-dead-letter-refused"
	// HeaderOriginKey is the failed record's key; absent for a nil key, and
	// for a key over MaxOriginKeyHeader bytes (see HeaderOriginKeySHA256).
	// (The dead-letter record keeps the key as its own key too; the header
	// survives a redrive that re-keys.)
	HeaderOriginKey = "tidemark-origin-key"
	// HeaderGroup is the consumer group (or share group) of the runner
	// that dead-lettered it, when the source names one.
	HeaderGroup = "tidemark-group"
	// HeaderErrorType is the Go type of the last error (for example
	// "*errors.errorString", "*runner.PanicError"), looking through the
	// runner's marks (Permanent, Transient) and fmt.Errorf's single %w
	// wrapping to the error they wrap, or a name of its own for the
	// errors the runner knows ("context.DeadlineExceeded"); see
	// ErrorType.
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

// failureHeaders are the headers that describe one dead-lettering; a
// record dead-lettered again has its old ones replaced.
var failureHeaders = map[string]bool{
	HeaderGroup: true, HeaderErrorType: true, HeaderError: true, HeaderErrorKind: true,
	HeaderAttempts: true, HeaderFirstFailure: true, HeaderLastFailure: true,
	HeaderDeadLetterCut: true, HeaderDeadLetterRefused: true,
}

// originHeaders are the headers of a record's origin.
var originHeaders = map[string]bool{
	HeaderOriginTopic: true, HeaderOriginPartition: true, HeaderOriginOffset: true,
	HeaderOriginTimestamp: true, HeaderOriginKey: true, HeaderOriginKeySHA256: true,
}

// MaxOriginKeyHeader is the longest key HeaderOriginKey copies; a longer
// one is carried as HeaderOriginKeySHA256. Every header tidemark adds is
// bounded so (the error by MaxErrorHeader, the error type and the group
// by maxNameHeader): the dead letter of a record the broker accepted is
// then at most the record plus a few KiB.
const MaxOriginKeyHeader = 1 << 10

// maxNameHeader bounds the error type and group headers.
const maxNameHeader = 256

// deadLetterHeaders returns rec's headers followed by the dead-letter
// headers, in a new slice (the record's own are never changed). The origin
// headers are added only when rec has no valid origin (OriginOf): a
// redriven record keeps its first origin, and a partial or malformed one
// (which identifies nothing) is replaced by rec's own.
func deadLetterHeaders(rec *Record, group string, cause error, kind ErrorKind, attempts int, first, last time.Time) []Header {
	_, has, bad := OriginOf(rec.Headers)
	keepOrigin := has && bad == nil
	hs := make([]Header, 0, len(rec.Headers)+12)
	for _, h := range rec.Headers {
		if !failureHeaders[h.Key] && (keepOrigin || !originHeaders[h.Key]) {
			hs = append(hs, h)
		}
	}
	if !keepOrigin {
		hs = append(hs,
			Header{Key: HeaderOriginTopic, Value: []byte(rec.Topic)},
			Header{Key: HeaderOriginPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
			Header{Key: HeaderOriginOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
		)
		if !rec.Timestamp.IsZero() {
			hs = append(hs, Header{Key: HeaderOriginTimestamp, Value: rfc3339(rec.Timestamp)})
		}
		switch {
		case rec.Key == nil:
		case len(rec.Key) <= MaxOriginKeyHeader:
			hs = append(hs, Header{Key: HeaderOriginKey, Value: rec.Key})
		default:
			sum := sha256.Sum256(rec.Key)
			hs = append(hs, Header{Key: HeaderOriginKeySHA256, Value: hex.AppendEncode(nil, sum[:])})
		}
	}
	if group != "" {
		hs = append(hs, Header{Key: HeaderGroup, Value: clip(group, maxNameHeader)})
	}
	return append(hs,
		Header{Key: HeaderErrorType, Value: clip(ErrorType(cause), maxNameHeader)},
		Header{Key: HeaderError, Value: clip(cause.Error(), MaxErrorHeader)},
		Header{Key: HeaderErrorKind, Value: []byte(kind.String())},
		Header{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
		Header{Key: HeaderFirstFailure, Value: rfc3339(first)},
		Header{Key: HeaderLastFailure, Value: rfc3339(last)},
	)
}

// RefusedError is a dead-letter write the broker refused for the record
// as it is, which retrying cannot change: too large (MESSAGE_TOO_LARGE,
// also franz-go's own for a record over its ProducerBatchMaxBytes,
// RECORD_LIST_TOO_LARGE, the dead-letter topic's max.message.bytes) or
// invalid (INVALID_RECORD). The sources' DeadLetterWriters return one
// (errors.As finds it); a writer of yours should too. The runner then
// writes a smaller dead letter: without the record's value and own
// headers, then without its key (HeaderDeadLetterCut), and if even that
// is refused, it retries with backoff, the record holding its partition,
// and says so in the log, in tidemark.dead_letters.refused and on the
// status page.
type RefusedError struct {
	Err error
}

func (e *RefusedError) Error() string {
	return "the broker refuses the record as it is: " + e.Err.Error()
}

func (e *RefusedError) Unwrap() error { return e.Err }

// cutDeadLetter returns dl, a dead letter, cut for the step-th
// time after the broker refused the fuller one with refused: step 1 drops
// the value and the failed record's own headers, step 2 the key too. The origin and
// failure headers stay, all bounded.
func cutDeadLetter(dl Record, step int, refused error) Record {
	out := dl
	out.Value = nil
	out.Headers = make([]Header, 0, len(dl.Headers)+2)
	for _, h := range dl.Headers {
		// Only the origin and failure headers: rec's own go.
		if originHeaders[h.Key] || (failureHeaders[h.Key] && h.Key != HeaderDeadLetterCut && h.Key != HeaderDeadLetterRefused) {
			out.Headers = append(out.Headers, h)
		}
	}
	cut := "value,headers"
	if step >= 2 {
		out.Key = nil
		cut += ",key"
	}
	out.Headers = append(out.Headers,
		Header{Key: HeaderDeadLetterCut, Value: []byte(cut)},
		Header{Key: HeaderDeadLetterRefused, Value: clip(refused.Error(), 1<<10)})
	return out
}

// MaxErrorHeader bounds the bytes of the HeaderError header: an error
// message of any length (a wrapped response body, a stack) must not make
// the dead letter too large for the broker, whose refusal would hold the
// record forever. A longer message is cut at a UTF-8 boundary and ends
// with how much was cut.
const MaxErrorHeader = 4 << 10

// clip returns msg as at most max bytes: cut, with a note of how many
// bytes were cut, when longer.
func clip(msg string, max int) []byte {
	if len(msg) <= max {
		return []byte(msg)
	}
	note := "… (" + strconv.Itoa(len(msg)) + " bytes, cut)"
	cut := max - len(note)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return append([]byte(msg[:cut]), note...)
}

func rfc3339(t time.Time) []byte { return t.UTC().AppendFormat(nil, time.RFC3339Nano) }

// ErrorType names err's kind for the HeaderErrorType header and the
// error.type attribute of spans and messaging.process.duration: see
// errorType (telemetry.go) for the rules. It is low in cardinality, so a
// dashboard can group by it.
func ErrorType(err error) string { return errorType(err) }

// Origin is the record a dead letter came from, as its origin headers
// (HeaderOriginTopic, HeaderOriginPartition, HeaderOriginOffset) name it.
type Origin struct {
	Topic     string
	Partition int32
	Offset    int64
}

// String names the origin as topic/partition@offset.
func (o Origin) String() string {
	return o.Topic + "/" + strconv.FormatInt(int64(o.Partition), 10) + "@" + strconv.FormatInt(o.Offset, 10)
}

// OriginOf reads the origin headers among hs (the last of a repeated one
// counts, as for Record.Header). ok is false when none of the three is
// there. err names what is wrong when they are there but incomplete or
// malformed: a missing one, a topic Kafka cannot have (1 to 249 of
// [a-zA-Z0-9._-], not "." or ".."), a partition or an offset that is not
// a non-negative number. The runner, pkg/inbox and `tidemark dlt replay`
// read origins with it alone, so they agree on what one is.
func OriginOf(hs []Header) (o Origin, ok bool, err error) {
	rec := Record{Headers: hs}
	t, okT := rec.Header(HeaderOriginTopic)
	p, okP := rec.Header(HeaderOriginPartition)
	off, okO := rec.Header(HeaderOriginOffset)
	switch {
	case !okT && !okP && !okO:
		return o, false, nil
	case !okT:
		return o, true, fmt.Errorf("header %s is missing", HeaderOriginTopic)
	case !okP:
		return o, true, fmt.Errorf("header %s is missing", HeaderOriginPartition)
	case !okO:
		return o, true, fmt.Errorf("header %s is missing", HeaderOriginOffset)
	case !kafkaTopic(t):
		return o, true, fmt.Errorf("header %s %q is not a Kafka topic name", HeaderOriginTopic, t)
	}
	pn, err := strconv.ParseInt(string(p), 10, 32)
	if err != nil || pn < 0 {
		return o, true, fmt.Errorf("header %s %q is not a partition number", HeaderOriginPartition, p)
	}
	on, err := strconv.ParseInt(string(off), 10, 64)
	if err != nil || on < 0 {
		return o, true, fmt.Errorf("header %s %q is not an offset", HeaderOriginOffset, off)
	}
	return Origin{Topic: string(t), Partition: int32(pn), Offset: on}, true, nil
}

// kafkaTopic reports whether t is a name Kafka allows for a topic: 1 to
// 249 of [a-zA-Z0-9._-], not "." or "..".
func kafkaTopic(t []byte) bool {
	if len(t) == 0 || len(t) > 249 || string(t) == "." || string(t) == ".." {
		return false
	}
	for _, c := range t {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
