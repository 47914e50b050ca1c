package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// TestTypedCallsTheHandlerWithTheValue: a value that decodes reaches h
// with its record, and h's error comes back as it is, unmarked.
func TestTypedCallsTheHandlerWithTheValue(t *testing.T) {
	errH := errors.New("handler says no")
	var got order
	var gotRec runner.Record
	h := runner.Typed(runner.JSON[order](), func(ctx context.Context, rec runner.Record, o order) error {
		got, gotRec = o, rec
		if o.ID == "refuse" {
			return errH
		}
		return nil
	})
	rec := runner.Record{Topic: "orders", Partition: 2, Offset: 7, Value: []byte(`{"id":"o-1","amount":12}`)}
	if err := h(context.Background(), rec); err != nil {
		t.Fatalf("h = %v, want nil", err)
	}
	if got != (order{ID: "o-1", Amount: 12}) || gotRec.String() != "orders/2@7" {
		t.Fatalf("handler got %+v for %s, want {o-1 12} for orders/2@7", got, gotRec.String())
	}
	err := h(context.Background(), runner.Record{Value: []byte(`{"id":"refuse"}`)})
	if err != errH {
		t.Fatalf("h = %v, want the handler's own error unwrapped", err)
	}
	if k := runner.KindOf(err); k != runner.Retryable {
		t.Fatalf("KindOf(handler's error) = %v, want retryable", k)
	}
}

// TestTypedDecodeFailureIsPermanent: a value the decoder rejects is a
// *DecodeError marked permanent, naming the record, the value's size and
// the decoder's error and no bytes of the value; h is not called.
func TestTypedDecodeFailureIsPermanent(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		nilValue    bool
		secret      string // not in the error: "hunter2" unless set
		want        string // in the decoder's error
		is          error
	}{
		{name: "nil", nilValue: true, want: "empty value", is: runner.ErrEmptyValue},
		{name: "empty", value: "", want: "empty value", is: runner.ErrEmptyValue},
		{name: "syntax", value: "password=hunter2", want: "invalid character"},
		{name: "not UTF-8", value: "\xff\xfehunter2", want: "invalid character"},
		{name: "trailing data", value: `{"id":"a"} hunter2`, want: "after top-level value"},
		{name: "wrong type", value: `{"id":"hunter2","amount":"hunter2"}`, want: "cannot unmarshal"},
		{name: "truncated", value: `{"id":"hunter2`, want: "unexpected end"},
		{name: "number out of range", value: `{"id":"x","amount":41111111111111111111}`, secret: "41111111111111111111",
			want: "json: cannot unmarshal number into Go struct field order.amount of type int"},
		{name: "number into a string", value: `{"id":-4111}`, secret: "4111", want: "cannot unmarshal number into Go struct field order.id of type string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			h := runner.Typed(runner.JSON[order](), func(context.Context, runner.Record, order) error {
				called = true
				return nil
			})
			rec := runner.Record{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("hunter2")}
			if !tc.nilValue {
				rec.Value = []byte(tc.value)
			}
			err := h(context.Background(), rec)
			if called {
				t.Fatal("the handler ran on a value that does not decode")
			}
			if k := runner.KindOf(err); k != runner.PermanentKind {
				t.Fatalf("KindOf(%v) = %v, want permanent", err, k)
			}
			var de *runner.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("%v (%T) is not a *runner.DecodeError", err, err)
			}
			if de.Record != "orders/3@42" || de.Size != len(tc.value) {
				t.Fatalf("DecodeError{Record: %q, Size: %d}, want orders/3@42, %d", de.Record, de.Size, len(tc.value))
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("errors.Is(%v, %v) = false", err, tc.is)
			}
			msg := err.Error()
			for _, want := range []string{"orders/3@42", tc.want} {
				if !strings.Contains(msg, want) {
					t.Fatalf("error %q does not say %q", msg, want)
				}
			}
			secret := "hunter2"
			if tc.secret != "" {
				secret = tc.secret
			}
			if strings.Contains(msg, secret) || !utf8.ValidString(msg) {
				t.Fatalf("error %q quotes the value (or is not UTF-8)", msg)
			}
		})
	}
}

// TestJSONDecoder: what JSON accepts besides the plain case.
func TestJSONDecoder(t *testing.T) {
	dec := runner.JSON[order]()
	// Unknown fields are ignored: a producer may add one.
	o, err := dec([]byte(`{"id":"a","amount":1,"currency":"EUR"}`))
	if err != nil || o != (order{ID: "a", Amount: 1}) {
		t.Fatalf("unknown field: %+v, %v; want {a 1}, nil", o, err)
	}
	// null is T's zero value, as with json.Unmarshal; a pointer type tells
	// it apart.
	if o, err := dec([]byte(" null ")); err != nil || o != (order{}) {
		t.Fatalf("null: %+v, %v; want the zero order, nil", o, err)
	}
	if p, err := runner.JSON[*order]()([]byte("null")); err != nil || p != nil {
		t.Fatalf("null into *order: %v, %v; want nil, nil", p, err)
	}
	// A failure returns the zero value, not what was decoded before it.
	if o, err := dec([]byte(`{"id":"a","amount":"x"}`)); err == nil || o != (order{}) {
		t.Fatalf("wrong type: %+v, %v; want the zero order and an error", o, err)
	}
	// A type error without its number still unwraps to encoding/json's.
	_, err = dec([]byte(`{"amount":1e400}`))
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field != "amount" {
		t.Fatalf("%v (%T): errors.As finds no *json.UnmarshalTypeError for amount", err, err)
	}
	if _, err := runner.JSON[int]()([]byte("1e400")); err == nil || err.Error() != "json: cannot unmarshal number into Go value of type int" {
		t.Fatalf("a top-level number: %v", err)
	}
}

// TestTypedPanicsOnNil: a nil decoder or handler is refused when wired,
// not on the first record.
func TestTypedPanicsOnNil(t *testing.T) {
	for name, f := range map[string]func(){
		"decode":  func() { runner.Typed[order](nil, func(context.Context, runner.Record, order) error { return nil }) },
		"handler": func() { runner.Typed(runner.JSON[order](), nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(v.(string), "nil") {
					t.Fatalf("recovered %v, want a panic naming the nil", v)
				}
			}()
			f()
		})
	}
}

// typedDLQ records the dead-letter records it is given.
type typedDLQ struct {
	mu  sync.Mutex
	got []runner.Record
}

func (d *typedDLQ) WriteDeadLetter(_ context.Context, _ string, rec runner.Record) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, rec)
	return nil
}

// TestTypedDecodeFailureIsDeadLettered: through the runner, a record that
// does not decode is dead-lettered after one attempt of the policy's five,
// with the decode error in its tidemark-error header and its kind
// permanent (and its value untouched); the others reach the handler, and
// the commit passes them all.
func TestTypedDecodeFailureIsDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := runnertest.New()
		src.Append(
			runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("a"), Value: []byte(`{"id":"a","amount":1}`)},
			runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte("b"), Value: []byte("\x00secret")},
			runner.Record{Topic: topic, Partition: 0, Offset: 2, Key: []byte("c"), Value: []byte(`{"id":"c","amount":3}`)},
		)
		var mu sync.Mutex
		var handled []string
		d := &typedDLQ{}
		r := newRunner(t, src, runner.Handle(topic, runner.Typed(runner.JSON[order](),
			func(ctx context.Context, rec runner.Record, o order) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, o.ID)
				return nil
			})),
			runner.Failure(runner.DeadLetter("t.dlq", 5, d)),
			runner.CommitInterval(time.Millisecond))
		started(t, r)
		assign(t, src, tp(0))
		await(t, time.Second, "commit passes the three records", committedAt(src, 0, 3))
		mu.Lock()
		defer mu.Unlock()
		slices.Sort(handled) // keys a and c run in parallel
		if strings.Join(handled, ",") != "a,c" {
			t.Fatalf("handled %v, want a and c", handled)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.got) != 1 || d.got[0].Offset != 1 || string(d.got[0].Value) != "\x00secret" {
			t.Fatalf("dead letters %v, want the record at offset 1 with its value", d.got)
		}
		e, _ := d.got[0].Header(runner.HeaderError)
		if !strings.Contains(string(e), "cannot decode the value of t/0@1 (7 bytes)") || strings.Contains(string(e), "secret") {
			t.Fatalf("%s = %q, want the decode error without the value", runner.HeaderError, e)
		}
		if n, _ := d.got[0].Header(runner.HeaderAttempts); string(n) != "1" {
			t.Fatalf("%s = %q, want 1: a decode failure is not retried", runner.HeaderAttempts, n)
		}
		if k, _ := d.got[0].Header(runner.HeaderErrorKind); string(k) != "permanent" {
			t.Fatalf("%s = %q, want permanent", runner.HeaderErrorKind, k)
		}
	})
}
