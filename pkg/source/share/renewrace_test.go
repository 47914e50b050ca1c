package share_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// TestSettleDuringARenewal: franz-go leaves a window open in which a
// record's renewal, drained for a request, and its terminal ack, marked
// meanwhile, both go out as the terminal ack; the broker refuses the
// second request's acks of the whole partition (INVALID_RECORD_STATE),
// and the innocent records beside it are delivered again. Renewals every
// 100 ms (a connection idle timeout of 300 ms under a 10 s lock: no lock
// runs out) while handlers of 0-200 ms settle records all the time: no ack
// may be refused.
func TestSettleDuringARenewal(t *testing.T) {
	t.Parallel()
	const n = 1000
	c := fake(t, "t", 1, n, kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": "10000",
		"group.share.delivery.count.limit":    "5",
	}))
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(2), share.MaxPollRecords(64), share.MeterProvider(mp),
		share.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond), kgo.ConnIdleTimeout(300*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	var d deliveries
	stop := run(t, src, runner.Handle("t", func(ctx context.Context, rec runner.Record) error {
		d.add(rec)
		time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond)
		return nil
	}), runner.Failure(runner.Skip(1)), runner.Order(runner.Unordered), runner.Concurrency(32))
	waitFor(t, "every record acknowledged", func() bool { return lag(t, c, "g", "t") == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	refused := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "tidemark.share.acks_refused" {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					et, _ := dp.Attributes.Value("error.type")
					refused[et.AsString()] += dp.Value
				}
			}
		}
	}
	again := 0
	d.mu.Lock()
	for _, counts := range d.counts {
		if len(counts) > 1 {
			again++
		}
	}
	d.mu.Unlock()
	if len(refused) > 0 || again > 0 {
		t.Errorf("acks refused %v, %d records run more than once: a terminal ack raced a renewal", refused, again)
	}
}
