//go:build integration

package integration_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// panickyMeters is a MeterProvider whose batch-size histogram panics while
// armed: a hook that fails on the batch leader's goroutine after COMMIT.
type panickyMeters struct {
	noop.MeterProvider
	armed *atomic.Bool
}

func (p panickyMeters) Meter(string, ...metric.MeterOption) metric.Meter {
	return panickyMeter{armed: p.armed}
}

type panickyMeter struct {
	noop.Meter
	armed *atomic.Bool
}

func (m panickyMeter) Int64Histogram(string, ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	return panickyHistogram{armed: m.armed}, nil
}

type panickyHistogram struct {
	noop.Int64Histogram
	armed *atomic.Bool
}

func (h panickyHistogram) Record(context.Context, int64, ...metric.RecordOption) {
	if h.armed.Load() {
		panic("meter provider panicked")
	}
}

// TestInboxBatchLeaderStops: with Batch, the goroutine leading a batch
// unwinds outside the effects' recover — runtime.Goexit from an effect
// before COMMIT (the transaction rolls back), a panicking meter provider
// after it (the transaction committed). Every other record of the batch
// gets an error at once instead of waiting forever, the partition is not
// left marked running, and running the failed records again applies each
// effect exactly once: re-applied after the rollback, a replay after the
// commit.
func TestInboxBatchLeaderStops(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		committed bool // the batch's transaction committed before the leader stopped
	}{
		{"Goexit in an effect", false},
		{"panic in a meter provider after commit", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pool := inboxDB(t)
			ctx := context.Background()
			tp := runner.TP{Topic: "t", Partition: 0}
			var armed atomic.Bool
			s := inboxStore(t, pool, "g", inbox.Batch(8), inbox.MeterProvider(panickyMeters{armed: &armed}))
			inboxTake(t, s, tp, -1)
			inGate, gate := make(chan struct{}), make(chan struct{})
			var stopNow atomic.Bool
			h := s.Handler(func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
				if rec.Offset == 0 {
					close(inGate)
					<-gate // hold the first batch so 1–5 queue behind it
				}
				if err := inboxEffect("a")(ctx, tx, rec); err != nil {
					return err
				}
				if rec.Offset == 3 && !tt.committed && stopNow.CompareAndSwap(true, false) {
					runtime.Goexit()
				}
				if rec.Offset == 3 && tt.committed && stopNow.CompareAndSwap(true, false) {
					armed.Store(true) // the batch's size is recorded after its COMMIT
				}
				return nil
			})
			type result struct {
				err      error
				returned bool
			}
			res := make([]result, 6)
			var wg sync.WaitGroup
			call := func(off int64) {
				wg.Go(func() {
					defer func() {
						if recover() != nil {
							armed.Store(false)
						}
					}()
					err := h(ctx, inboxRec("t", 0, off))
					res[off] = result{err, true}
				})
			}
			stopNow.Store(true)
			call(0)
			<-inGate
			for off := int64(1); off <= 5; off++ {
				call(off)
			}
			time.Sleep(200 * time.Millisecond) // 1–5 queue behind record 0
			close(gate)
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the records of the stopped leader's batch still wait after 30 s")
			}
			if !res[0].returned || res[0].err != nil {
				t.Fatalf("record 0: %+v", res[0])
			}
			stopped, failed := 0, 0
			var again []int64
			for off := int64(1); off <= 5; off++ {
				switch r := res[off]; {
				case !r.returned:
					stopped++
					again = append(again, off)
				case r.err != nil:
					failed++
					again = append(again, off)
					if errors.Is(r.err, runner.ErrFenced) {
						t.Errorf("record %d: %v must not read as fenced: the runner would drop it", off, r.err)
					}
				}
			}
			if stopped != 1 || failed == 0 {
				t.Fatalf("%d leader stopped and %d records failed, want 1 and the rest of its batch: %+v", stopped, failed, res)
			}
			wantEffects := int64(1)
			if tt.committed {
				wantEffects = 6
			}
			if e := inboxCount(t, pool, "SELECT count(*) FROM effects"); e != wantEffects {
				t.Fatalf("%d effects after the leader stopped, want %d", e, wantEffects)
			}

			// The runner runs the failed records again: the partition
			// takes them, and each is applied exactly once.
			for _, off := range again {
				call(off)
			}
			wg.Wait()
			for _, off := range again {
				if r := res[off]; !r.returned || r.err != nil {
					t.Fatalf("record %d again: %+v", off, r)
				}
			}
			if e, d := inboxCount(t, pool, "SELECT count(*) FROM effects"),
				inboxCount(t, pool, `SELECT count(DISTINCT "offset") FROM effects`); e != 6 || d != 6 {
				t.Fatalf("%d effects for %d offsets, want 6 of 6", e, d)
			}
			if r := inboxCount(t, pool, "SELECT count(*) FROM tidemark_inbox"); r != 6 {
				t.Fatalf("%d inbox rows, want 6", r)
			}
		})
	}
}
