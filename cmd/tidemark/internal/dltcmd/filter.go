// Package dltcmd is `tidemark dlt`: operations on tidemark's dead-letter
// topics — replay (redrive) their records to a topic.
package dltcmd

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Filter chooses the dead letters a replay republishes. Its zero value
// takes every dead letter of every origin. Every set field must match.
type Filter struct {
	// OriginTopic is the origin topic (runner.HeaderOriginTopic) a dead
	// letter must have; "" takes any.
	OriginTopic string
	// Partition is the origin partition; -1 takes any.
	Partition int32
	// From and To bound the origin offset, inclusive; To -1 is no bound.
	From, To int64
	// Error is a substring of the dead letter's error or error type
	// (runner.HeaderError, HeaderErrorType); "" takes any.
	Error string
	// Headers must each be on the record: with a value, the last header of
	// that name has exactly it; without (HasValue false), present at all.
	Headers []HeaderMatch
}

// HeaderMatch is one --header condition.
type HeaderMatch struct {
	Key      string
	Value    []byte
	HasValue bool
}

// Origin is what a dead letter's origin headers say.
type Origin = runner.Origin

// Reasons a dead letter is left.
const (
	LeftNoOrigin    = "no origin headers"
	LeftOtherOrigin = "other origin topic"
	LeftFiltered    = "filtered out"
	// LeftCut is a dead letter the runner wrote without the record's
	// value (the broker refused the whole one): there is nothing to
	// replay. Its origin headers say which record it was.
	LeftCut = "cut, without the record's value"
)

// header returns the last header named key.
func header(hs []runner.Header, key string) ([]byte, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return hs[i].Value, true
		}
	}
	return nil, false
}

// OriginOf reads a dead letter's origin headers (runner.OriginOf); ok is
// false when any of the three is missing or malformed: the record is not a
// tidemark dead letter that pkg/inbox could recognise when redriven.
func OriginOf(hs []runner.Header) (Origin, bool) {
	o, ok, err := runner.OriginOf(hs)
	return o, ok && err == nil
}

// Match says whether f takes a dead letter with headers hs, and if not,
// why (one of the Left reasons).
func (f *Filter) Match(hs []runner.Header) (Origin, string) {
	o, ok := OriginOf(hs)
	if !ok {
		return o, LeftNoOrigin
	}
	if f.OriginTopic != "" && o.Topic != f.OriginTopic {
		return o, LeftOtherOrigin
	}
	if _, cut := header(hs, runner.HeaderDeadLetterCut); cut {
		return o, LeftCut
	}
	if f.Partition >= 0 && o.Partition != f.Partition {
		return o, LeftFiltered
	}
	if o.Offset < f.From || (f.To >= 0 && o.Offset > f.To) {
		return o, LeftFiltered
	}
	if f.Error != "" {
		e, _ := header(hs, runner.HeaderError)
		et, _ := header(hs, runner.HeaderErrorType)
		if !bytes.Contains(e, []byte(f.Error)) && !bytes.Contains(et, []byte(f.Error)) {
			return o, LeftFiltered
		}
	}
	for _, m := range f.Headers {
		v, ok := header(hs, m.Key)
		if !ok || (m.HasValue && !bytes.Equal(v, m.Value)) {
			return o, LeftFiltered
		}
	}
	return o, ""
}

// ParseOffsets parses --offsets: "A-B" (inclusive), "A-" (from A) or "A"
// (only A).
func ParseOffsets(s string) (from, to int64, err error) {
	bad := fmt.Errorf("--offsets %q is not FROM-TO, FROM- or OFFSET (origin offsets, inclusive, not negative)", s)
	a, b, ranged := strings.Cut(s, "-")
	from, err = strconv.ParseInt(a, 10, 64)
	if err != nil || from < 0 {
		return 0, 0, bad
	}
	switch {
	case !ranged:
		return from, from, nil
	case b == "":
		return from, -1, nil
	}
	to, err = strconv.ParseInt(b, 10, 64)
	if err != nil || to < from {
		return 0, 0, bad
	}
	return from, to, nil
}

// ParseHeader parses one --header: "KEY=VALUE" or "KEY".
func ParseHeader(s string) (HeaderMatch, error) {
	k, v, hasValue := strings.Cut(s, "=")
	if k == "" {
		return HeaderMatch{}, fmt.Errorf("--header %q has no header name (KEY=VALUE or KEY)", s)
	}
	return HeaderMatch{Key: k, Value: []byte(v), HasValue: hasValue}, nil
}

// dropped are the headers a replay does not carry to the topic: they
// describe the attempts that failed, not the record. Left on it they would
// mislead a handler reading them, and a record dead-lettered again would
// carry two sets (the runner adds its own). The origin headers stay: they
// are the record's identity, which pkg/inbox deduplicates by, and the
// runner keeps the first origin when it dead-letters a record again.
var dropped = map[string]bool{
	runner.HeaderError:        true,
	runner.HeaderErrorType:    true,
	runner.HeaderErrorKind:    true,
	runner.HeaderAttempts:     true,
	runner.HeaderFirstFailure: true,
	runner.HeaderLastFailure:  true,
	runner.HeaderGroup:        true,
}

// Republished returns the headers a replayed record carries: hs without
// the failure headers (see dropped), in order.
func Republished(hs []runner.Header) []runner.Header {
	out := make([]runner.Header, 0, len(hs))
	for _, h := range hs {
		if !dropped[h.Key] {
			out = append(out, h)
		}
	}
	return out
}
