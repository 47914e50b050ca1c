//go:build integration

package integration_test

// The cost of the share source's ack gating (docs/share.md): records/s with
// one and four sessions, no-op and 5 ms handlers, Concurrency 64, against
// the consumer-group source (franz) on the same kind of topic.
//
//	go test -tags integration -run '^$' -bench BenchmarkShareThroughput -benchtime 1x ./integration/

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
	"github.com/tidemark/tidemark/pkg/source/share"
)

func BenchmarkShareThroughput(b *testing.B) {
	const partitions = 4
	for _, hc := range []struct {
		name  string
		n     int
		delay time.Duration
	}{
		{"noop", 40_000, 0},
		{"5ms", 15_000, 5 * time.Millisecond},
	} {
		for _, sc := range []struct {
			name string
			src  func(b *testing.B, group, topic string) runner.Source
			opts []runner.Option
		}{
			{"share-S1", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(1))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"share-S4", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(4))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"share-S4-M512", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(4), share.MaxPollRecords(512))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"group-franz", func(b *testing.B, group, topic string) runner.Source {
				src, err := franz.New(bed.Kafka(b), group, []string{topic}, franz.Logger(quietLogger()))
				if err != nil {
					b.Fatal(err)
				}
				return src
			}, []runner.Option{runner.Order(runner.Unordered)}},
		} {
			b.Run(hc.name+"/"+sc.name, func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					topic, group := bed.Topic(b, partitions), bed.Name(b, "bench")
					bed.Produce(b, topic, hc.n, nil)
					var done atomic.Int64
					var first, last atomic.Int64 // unix nanos
					r, err := runner.New(sc.src(b, group, topic), append([]runner.Option{
						runner.Handle(topic, func(ctx context.Context, _ runner.Record) error {
							now := time.Now().UnixNano()
							first.CompareAndSwap(0, now)
							if hc.delay > 0 {
								time.Sleep(hc.delay)
							}
							done.Add(1)
							last.Store(time.Now().UnixNano())
							return nil
						}),
						runner.Concurrency(64), runner.Logger(quietLogger()),
					}, sc.opts...)...)
					if err != nil {
						b.Fatal(err)
					}
					errc := make(chan error, 1)
					b.StartTimer()
					go func() { errc <- r.Run(context.Background()) }()
					kafkatest.WaitFor(b, 5*time.Minute, "every record handled", func() bool { return done.Load() >= int64(hc.n) })
					b.StopTimer()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_ = r.Shutdown(ctx)
					cancel()
					<-errc
					secs := time.Duration(last.Load() - first.Load()).Seconds()
					b.ReportMetric(float64(hc.n)/secs, "records/s")
					b.ReportMetric(float64(done.Load()-int64(hc.n)), "redelivered")
				}
			})
		}
	}
}

func benchShare(b *testing.B, group, topic string, opts ...share.Option) *share.Source {
	b.Helper()
	src, err := share.New(bed.Kafka(b), group, []string{topic}, append([]share.Option{
		share.GroupConfig("share.auto.offset.reset", "earliest"), share.Logger(quietLogger()),
	}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return src
}
