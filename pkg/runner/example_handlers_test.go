package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// The code between "snippet: NAME" and "end snippet" lines is copied into
// docs/runner.md's "Handlers and middleware" section, where a
// "<!-- snippet: NAME -->" line precedes it; TestDocSnippets keeps the two
// the same.

// snippet: typed

// Payment is a topic's JSON value.
type Payment struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// A typed handler: Typed decodes each record's value with JSON and calls
// the handler with the Payment. A value that does not decode never reaches
// it: its error is permanent, so the failure policy dead-letters or skips
// the record at once.
func ExampleTyped() {
	h := runner.Typed(runner.JSON[Payment](), func(ctx context.Context, rec runner.Record, p Payment) error {
		fmt.Printf("%s: payment %s of %d cents\n", rec.String(), p.ID, p.Cents)
		return nil
	})
	// runner.Handle("payments", h) has the runner call h for each record
	// of the topic; here two records are given to it by hand.
	ctx := context.Background()
	_ = h(ctx, runner.Record{Topic: "payments", Partition: 0, Offset: 41, Value: []byte(`{"id":"p-1","cents":1250}`)})
	err := h(ctx, runner.Record{Topic: "payments", Partition: 0, Offset: 42, Value: []byte(`{"id":"p-2","cents":"12.50"}`)})
	fmt.Println(runner.KindOf(err))
	fmt.Println(err)
	// Output:
	// payments/0@41: payment p-1 of 1250 cents
	// permanent
	// permanent: runner: cannot decode the value of payments/0@42 (28 bytes): json: cannot unmarshal string into Go struct field Payment.cents of type int64
}

// end snippet

// snippet: strict

// decodeStrict is a decoder for Typed that refuses fields Payment does not
// have, where JSON ignores them. Refuse them only when producer and
// consumer deploy together: a producer that adds a field turns every new
// record into a permanent failure.
func decodeStrict(value []byte) (Payment, error) {
	var p Payment
	if len(value) == 0 {
		return p, runner.ErrEmptyValue
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Payment{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Payment{}, errors.New("data after the JSON value")
	}
	return p, nil
}

// A decoder of one's own: any func([]byte) (T, error), safe for concurrent
// use.
func ExampleTyped_strict() {
	h := runner.Typed(decodeStrict, func(ctx context.Context, rec runner.Record, p Payment) error {
		return nil
	})
	err := h(context.Background(), runner.Record{Topic: "payments", Offset: 7, Value: []byte(`{"id":"p-3","cents":5,"currency":"EUR"}`)})
	fmt.Println(err)
	// Output:
	// permanent: runner: cannot decode the value of payments/0@7 (39 bytes): json: unknown field "currency"
}

// end snippet

// snippet: chain

// Middleware wraps a handler: Chain(h, a, b) runs a(b(h)). LogFailures
// logs each failed attempt; put it outside Timeout so that it logs the
// timeout's error.
func ExampleChain() {
	// A logger for the example's output: no time, so that the output is
	// the same on every run.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	slow := func(ctx context.Context, rec runner.Record) error {
		<-ctx.Done() // a call that waits until its ctx ends
		return ctx.Err()
	}
	h := runner.Chain(slow,
		runner.LogFailures(logger),
		runner.Timeout(10*time.Millisecond),
	)
	// Given by hand, outside a runner: ctx carries no attempt number, so
	// the log says attempt=0 (the runner's first attempt is 1).
	err := h(context.Background(), runner.Record{Topic: "payments", Partition: 3, Offset: 9})
	fmt.Println(runner.KindOf(err), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// level=WARN msg="handler attempt failed" record=payments/3@9 attempt=0 kind=retryable err="runner: handler for payments/3@9 timed out after 10ms: context deadline exceeded"
	// retryable true
}

// end snippet

// snippet: middleware

// transientOn marks the errors that isTransient recognises as Transient:
// the failure policy then retries their records without counting the
// attempts.
func transientOn(isTransient func(error) bool) runner.Middleware {
	return func(next runner.Handler) runner.Handler {
		return func(ctx context.Context, rec runner.Record) error {
			err := next(ctx, rec)
			if err != nil && isTransient(err) {
				return runner.Transient(err)
			}
			return err
		}
	}
}

var errUnavailable = errors.New("database unavailable")

// Writing a middleware: a func(runner.Handler) runner.Handler.
func ExampleMiddleware() {
	h := runner.Chain(
		func(ctx context.Context, rec runner.Record) error {
			if rec.Offset == 1 {
				return fmt.Errorf("insert payment: %w", errUnavailable)
			}
			return errors.New("invalid payment")
		},
		transientOn(func(err error) bool { return errors.Is(err, errUnavailable) }),
	)
	for off := range int64(2) {
		err := h(context.Background(), runner.Record{Topic: "payments", Offset: off})
		fmt.Printf("%d: %v: %v\n", off, runner.KindOf(err), err)
	}
	// Output:
	// 0: retryable: invalid payment
	// 1: transient: transient: insert payment: database unavailable
}

// end snippet
