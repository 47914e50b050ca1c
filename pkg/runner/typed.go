package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Typed returns a Handler that decodes each record's value with decode and
// calls h with the record and the decoded value. A value decode rejects is
// a *DecodeError marked Permanent, which the failure policy dead-letters
// or skips at once (Block retries it as any error), without calling h: a
// record that cannot be decoded fails the same way on every attempt. h's own errors are returned as they
// are.
//
// decode is called for every attempt, from many workers at once: it must
// be safe for concurrent use, and must not keep or modify the bytes it is
// given (they are the record's, which a retry and the dead-letter write
// see again). Its error goes into the *DecodeError's message, the runner's
// logs and the dead-letter headers as it is: a decoder must not quote
// secret values in it. JSON returns one for encoding/json.
//
// Typed panics if decode or h is nil, as a programming error found when
// the handlers are wired, not per record.
//
// Decoding is an adapter, not a Middleware: it changes the handler's type,
// which a func(Handler) Handler cannot do without passing the value in a
// context, untyped. Wrap the Handler Typed returns with Chain as any
// other.
func Typed[T any](decode func(value []byte) (T, error), h func(ctx context.Context, rec Record, v T) error) Handler {
	if decode == nil {
		panic("runner: Typed with a nil decode function")
	}
	if h == nil {
		panic("runner: Typed with a nil handler")
	}
	return func(ctx context.Context, rec Record) error {
		v, err := decode(rec.Value)
		if err != nil {
			return Permanent(&DecodeError{Record: rec.String(), Size: len(rec.Value), Err: err})
		}
		return h(ctx, rec, v)
	}
}

// DecodeError is a record value that Typed's decode function rejected.
// Typed returns it marked Permanent; errors.As finds it through the mark.
// Its message names the record and the value's size, never the value's
// bytes: a value can be binary, or secret, and the message goes to logs
// and dead-letter headers (the dead-letter record keeps the value itself).
type DecodeError struct {
	Record string // topic/partition@offset
	Size   int    // the value's length in bytes
	Err    error  // the decoder's error
}

func (e *DecodeError) Error() string {
	msg := "runner: cannot decode the value of " + e.Record + " (" + strconv.Itoa(e.Size) + " bytes)"
	if e.Err == nil {
		return msg
	}
	return msg + ": " + e.Err.Error()
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ErrEmptyValue is the error of JSON's decoder for a nil or empty value
// (a tombstone on a compacted topic has a nil value).
var ErrEmptyValue = errors.New("runner: empty value (nil or zero bytes) is not JSON")

// JSON returns a decoder of JSON values into a T for Typed, with
// encoding/json's Unmarshal: the value must be exactly one JSON value
// (trailing data is an error), and a nil or empty value is ErrEmptyValue.
// The JSON literal null leaves T's zero value, as Unmarshal does; decode
// into a pointer type to tell null apart. Its errors never quote the
// value, which may hold secrets or personal data: they wrap Unmarshal's
// (errors.As finds them) under a message of their own. A type mismatch
// names the kind of JSON value, the field and the Go type; a syntax error
// names the byte offset; a time.Time field's error names the layout; any
// other error — an UnmarshalJSON or UnmarshalText method's (a
// json.Number, a netip.Addr, a type of yours), a misused ",string" tag —
// names the error's Go type and T, and leaves its message out, as the
// decoder cannot know what that message quotes.
//
// Fields of the value that T does not have are ignored, as Unmarshal
// ignores them: producers and consumers of a topic are deployed apart, and
// a producer that adds a field (a compatible change under any schema
// evolution rule) must not turn every new record into a decode failure —
// each would be dead-lettered or skipped at once, being permanent. A
// consumer that wants them refused writes its decoder with a json.Decoder
// and DisallowUnknownFields (docs/runner.md shows one).
//
// The decoder is safe for concurrent use.
func JSON[T any]() func(value []byte) (T, error) {
	return func(value []byte) (T, error) {
		var v T
		if len(value) == 0 {
			return v, ErrEmptyValue
		}
		if err := json.Unmarshal(value, &v); err != nil {
			var zero T // not the half-filled v
			return zero, jsonError[T](err)
		}
		return v, nil
	}
}

// jsonError returns an error that wraps Unmarshal's err and quotes none of
// the value. Only what the decoder knows to be free of the value's text
// goes into its message: an allow-list, as a message of an unknown error
// can quote anything (a *json.UnmarshalTypeError quotes the number it
// could not store, a *json.SyntaxError the character it stopped at, a
// TextUnmarshaler its whole input).
func jsonError[T any](err error) error {
	var ie *json.InvalidUnmarshalError
	if errors.As(err, &ie) {
		return err // about the Go type only
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		// The description without the character it stopped at
		// ("invalid character 'x' after top-level value").
		what := quotedChar.ReplaceAllString(se.Error(), "invalid character")
		return &redactedError{msg: "json: " + what + " (at byte offset " + strconv.FormatInt(se.Offset, 10) + ")", err: err}
	}
	// A time.Time field's UnmarshalJSON fails with a *time.ParseError,
	// whose message quotes the string it refused (in its Message too).
	var pe *time.ParseError
	if errors.As(err, &pe) {
		return &redactedError{msg: "json: cannot parse a time as " + strconv.Quote(pe.Layout), err: err}
	}
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Type == nil {
		return &redactedError{msg: fmt.Sprintf("json: cannot decode into %v: a %T (its message is left out, it may quote the value)", reflect.TypeFor[T](), err), err: err}
	}
	kind, _, _ := strings.Cut(te.Value, " ") // "number -5" -> "number"
	into := "Go value"
	if te.Struct != "" || te.Field != "" {
		into = "Go struct field " + te.Struct + "." + te.Field
	}
	return &redactedError{msg: "json: cannot unmarshal " + kind + " into " + into + " of type " + te.Type.String(), err: err}
}

// quotedChar is the character a *json.SyntaxError's message quotes.
var quotedChar = regexp.MustCompile(`^invalid character '(?:\\.|[^\\'])+'`)

// redactedError is an error whose message leaves out what its wrapped
// error's quotes of a value.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
