package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

type noCoordinator struct{}

func (noCoordinator) PartitionOwners(context.Context, string, []runner.TP) (map[runner.TP]string, error) {
	return nil, errors.New("none")
}

// TestShareGroupRefuses: what does not apply to a share group is refused
// with an error that says why, before any database call (the pool points
// nowhere): Owners at New, the assign hook, and a record that did not come
// from a share group; and a Store without ShareGroup sent a share record
// says which option it lacks.
func TestShareGroupRefuses(t *testing.T) {
	_, err := inbox.New(nowhere(t), "g", inbox.ShareGroup(), inbox.Owners(noCoordinator{}))
	var ce *inbox.ConfigError
	if !errors.As(err, &ce) || ce.Option != "Owners" || !strings.Contains(err.Error(), "share group") {
		t.Fatalf("ShareGroup with Owners: %v, want a ConfigError for Owners naming the share group", err)
	}

	s, err := inbox.New(nowhere(t), "g", inbox.ShareGroup())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.AssignHook()(context.Background(), []runner.Assignment{{TP: runner.TP{Topic: "t"}}})
	if err == nil || !strings.Contains(err.Error(), "takes no leases") {
		t.Fatalf("assign hook of a ShareGroup Store: %v, want it refused", err)
	}
	ran := false
	h := s.Handler(func(context.Context, pgx.Tx, runner.Record) error { ran = true; return nil })
	err = h(context.Background(), runner.Record{Topic: "t", Partition: 2, Offset: 9})
	if !errors.Is(err, inbox.ErrNotShared) || !strings.Contains(err.Error(), "t/2@9") || ran {
		t.Fatalf("consumer-group record to a ShareGroup Store: %v (effect ran: %v), want ErrNotShared naming t/2@9", err, ran)
	}

	plain, err := inbox.New(nowhere(t), "g")
	if err != nil {
		t.Fatal(err)
	}
	err = plain.Handler(func(context.Context, pgx.Tx, runner.Record) error { ran = true; return nil })(
		context.Background(), runner.Record{Topic: "t", Partition: 2, Offset: 9, DeliveryCount: 1})
	if !errors.Is(err, inbox.ErrNoLease) || !strings.Contains(err.Error(), "inbox.ShareGroup()") || ran {
		t.Fatalf("share record to a Store without ShareGroup: %v (effect ran: %v), want ErrNoLease pointing at ShareGroup", err, ran)
	}
}
