package share_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// TestRefusedAcksAreCounted: an acknowledgement the broker refuses (here
// the first ShareAcknowledge, which carries the renewal of a record whose
// handler outlives its lock) is counted in tidemark.share.acks_refused,
// with its partition and the Kafka error, and the record, delivered
// again, still ends accepted.
func TestRefusedAcksAreCounted(t *testing.T) {
	t.Parallel()
	c := fake(t, "t", 1, 1, kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": "1000",
		"group.share.delivery.count.limit":    "5",
		"share.record.lock.sweep.interval.ms": "100",
	}))
	c.SetGroupConfigs("g", map[string]string{"share.auto.offset.reset": "earliest"})
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.ShareAcknowledge), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ShareAcknowledgeRequest)
		if refused.Load() > 0 {
			return nil, nil, false
		}
		resp, n := refuseAcks(r)
		refused.Add(int32(n))
		return resp, nil, true
	})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	src, err := share.New(c.ListenAddrs(), "g", []string{"t"}, share.Sessions(1), share.MaxPollRecords(8),
		share.ClientOptions(kgo.FetchMaxWait(100*time.Millisecond)), share.MeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src, runner.Handle("t", func(ctx context.Context, rec runner.Record) error {
		if rec.DeliveryCount == 1 {
			// Past the lock: the session renews it meanwhile.
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}), runner.Failure(runner.Skip(1)))
	waitFor(t, "the record acknowledged", func() bool { return lag(t, c, "g", "t") == 0 })
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if refused.Load() == 0 {
		t.Fatal("no ShareAcknowledge reached the broker: the test refused nothing")
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "tidemark.share.acks_refused" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				et, _ := dp.Attributes.Value("error.type")
				part, _ := dp.Attributes.Value("messaging.destination.partition.id")
				group, _ := dp.Attributes.Value("messaging.consumer.group.name")
				if part.AsString() != "0" || group.AsString() != "g" {
					t.Errorf("tidemark.share.acks_refused attributes %v, want partition 0 and group g", dp.Attributes.ToSlice())
				}
				got[et.AsString()] += dp.Value
			}
		}
	}
	// franz-go resets its session after the refusal and drops the acks
	// it had queued (INVALID_SHARE_SESSION_EPOCH): counted too, as what
	// they are.
	if want := int64(refused.Load()); got["INVALID_RECORD_STATE"] != want {
		t.Errorf("tidemark.share.acks_refused by error.type %v, want %d INVALID_RECORD_STATE (the partitions the broker refused)", got, want)
	}
	t.Logf("tidemark.share.acks_refused by error.type: %v", got)
}
