//go:build integration

package integration_test

// The cost of the share source's ack gating (docs/share.md): records/s with
// one and four sessions (polls of 512, the default, and of 128), no-op and
// 5 ms handlers, Concurrency 64, 4 partitions, against the consumer-group
// source (franz) on the same kind of topic. records/s runs from the first
// handler call to the last (the group join is left out); redelivered
// counts handler calls beyond one per record. In 5ms-straggler one record
// in 1000 takes a second: a session waits for its slowest record before it
// polls again, which the other sessions make up for.
//
//	go test -tags integration -run '^$' -bench BenchmarkShareThroughput -benchtime 1x ./integration/

import (
	"context"
	"strconv"
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
		slow  int // every slow-th record takes a second (0: none)
	}{
		{"noop", 40_000, 0, 0},
		{"5ms", 15_000, 5 * time.Millisecond, 0},
		{"5ms-straggler", 15_000, 5 * time.Millisecond, 1000},
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
			{"share-S1-M128", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(1), share.MaxPollRecords(128))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"share-S4-M128", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(4), share.MaxPollRecords(128))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"share-S16-M128", func(b *testing.B, group, topic string) runner.Source {
				return benchShare(b, group, topic, share.Sessions(16), share.MaxPollRecords(128))
			}, []runner.Option{runner.Failure(runner.Skip(3))}},
			{"group-franz", func(b *testing.B, group, topic string) runner.Source {
				src, err := franz.New(bed.Kafka(b), group, []string{topic}, franz.Logger(kafkatest.Logger(b)))
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
						runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
							now := time.Now().UnixNano()
							first.CompareAndSwap(0, now)
							switch v, _ := strconv.Atoi(string(rec.Value)); {
							case hc.slow > 0 && v%hc.slow == hc.slow-1:
								time.Sleep(time.Second)
							case hc.delay > 0:
								time.Sleep(hc.delay)
							}
							done.Add(1)
							last.Store(time.Now().UnixNano())
							return nil
						}),
						runner.Concurrency(64), runner.Logger(kafkatest.Logger(b)),
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
		share.GroupConfig("share.auto.offset.reset", "earliest"), share.Logger(kafkatest.Logger(b)),
	}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return src
}
