package share_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// transactional writes one record per transaction to topic t: committed
// or aborted as commits says, values "c0", "a1", ... by index.
func transactional(t *testing.T, addrs []string, commits ...bool) (committed []string) {
	t.Helper()
	p, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.TransactionalID("txn"), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for i, commit := range commits {
		v := map[bool]string{true: "c", false: "a"}[commit] + string(rune('0'+i))
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := p.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := p.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
		if commit {
			committed = append(committed, v)
		}
	}
	return committed
}

// handledValues runs a runner over src until it handled want records
// (or 3 s passed once want is 0), and returns the values it saw, sorted.
func handledValues(t *testing.T, src *share.Source, want int) []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	stop := run(t, src, runner.Handle("t", func(_ context.Context, rec runner.Record) error {
		mu.Lock()
		got = append(got, string(rec.Value))
		mu.Unlock()
		return nil
	}), runner.Failure(runner.Skip(1)))
	waitFor(t, "the committed records handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= want })
	time.Sleep(500 * time.Millisecond) // an aborted record would come with them
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	return got
}

// TestReadCommitted: a share source reads committed records only, as the
// group sources do: the share group's share.isolation.level defaults to
// read_uncommitted, so the source sets read_committed unless its
// GroupConfig says otherwise. (Aborted records reached the handler.)
func TestReadCommitted(t *testing.T) {
	c := fake(t, "t", 1, 0)
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	committed := transactional(t, c.ListenAddrs(), true, false, true, false, true)
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := handledValues(t, src, len(committed)); !slices.Equal(got, committed) {
		t.Errorf("handled %q, want the committed transactions' records %q only", got, committed)
	}
}

// TestReadUncommittedByChoice: GroupConfig("share.isolation.level",
// "read_uncommitted") is the user's choice, and kept.
func TestReadUncommittedByChoice(t *testing.T) {
	c := fake(t, "t", 1, 0)
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	transactional(t, c.ListenAddrs(), true, false)
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1),
		share.GroupConfig("share.isolation.level", "read_uncommitted"))
	if err != nil {
		t.Fatal(err)
	}
	if got := handledValues(t, src, 2); !slices.Equal(got, []string{"a1", "c0"}) {
		t.Errorf("handled %q, want both records, the aborted one too", got)
	}
}
