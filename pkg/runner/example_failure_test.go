package runner_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

var errInvalid = errors.New("invalid order")

// Each topic has its own policy, dead-letter topic and timeout; a record
// the handler rejects as invalid is dead-lettered at once (Permanent),
// and an outage is retried without counting (Transient).
func ExampleHandle_perTopic() {
	orders := func(ctx context.Context, rec runner.Record) error {
		if len(rec.Value) == 0 {
			return runner.Permanent(fmt.Errorf("order %s: %w", rec.String(), errInvalid))
		}
		if err := store(ctx, rec); err != nil {
			return runner.Transient(err) // the store is down: wait for it
		}
		return nil
	}
	src, dlw := runnertest.New(), deadLetters{} // nil writes through the source, as franz does
	clicks := func(ctx context.Context, rec runner.Record) error {
		if runner.Attempt(ctx) > 1 {
			fmt.Println("retrying", rec.String())
		}
		return nil
	}
	// snippet: pertopic
	_, err := runner.New(src,
		runner.Handle("orders", orders,
			runner.WithPolicy(runner.DeadLetter("orders.dlt", 5, dlw)),
			runner.WithTimeout(30*time.Second)),
		runner.Handle("clicks", clicks, runner.WithPolicy(runner.Skip(3))),
		runner.Failure(runner.DeadLetter("all.dlt", 5, dlw)), // every other topic
	)
	// end snippet
	fmt.Println(err)
	// Output: <nil>
}

func store(context.Context, runner.Record) error { return nil }

type deadLetters struct{}

func (deadLetters) WriteDeadLetter(context.Context, string, runner.Record) error { return nil }
