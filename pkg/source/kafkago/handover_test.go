package kafkago_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// fetchLog counts the fetch requests the kfake cluster gets, per partition
// and fetch offset; after first reports when every one of n partitions
// was fetched at offset 0.
type fetchLog struct {
	mu    sync.Mutex
	at    map[int32]map[int64]int
	n     int
	first chan struct{}
}

func watchFetches(c *kafkatest.Cluster, topic string, partitions int) *fetchLog {
	l := &fetchLog{at: map[int32]map[int64]int{}, n: partitions, first: make(chan struct{})}
	c.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, rt := range req.(*kmsg.FetchRequest).Topics {
			if rt.Topic != topic {
				continue
			}
			for _, rp := range rt.Partitions {
				if l.at[rp.Partition] == nil {
					l.at[rp.Partition] = map[int64]int{}
				}
				l.at[rp.Partition][rp.FetchOffset]++
			}
		}
		zero := 0
		for _, offs := range l.at {
			if offs[0] > 0 {
				zero++
			}
		}
		if zero == l.n {
			select {
			case <-l.first:
			default:
				close(l.first)
			}
		}
		return nil, nil, false // observe only: kfake answers
	})
	return l
}

// handOvers is a Sink that records every hand-over: how many partitions
// and records each carried. Until release is closed, the first hand-over
// with records waits.
type handOvers struct {
	runner.Sink
	release chan struct{}
	entered chan struct{}

	mu    sync.Mutex
	calls []int // partitions with records, per hand-over with records
	total int
}

func (h *handOvers) Fetched(ctx context.Context, batches []runner.Batch) (int, error) {
	parts, recs := 0, 0
	for _, b := range batches {
		if len(b.Records) > 0 {
			parts++
			recs += len(b.Records)
		}
	}
	if parts > 0 {
		h.mu.Lock()
		first := len(h.calls) == 0
		h.calls = append(h.calls, parts)
		h.total += recs
		h.mu.Unlock()
		if first {
			close(h.entered)
			<-h.release
		}
	}
	return h.Sink.Fetched(ctx, batches)
}

func (h *handOvers) seen() ([]int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.calls...), h.total
}

type handOverSource struct {
	*kafkago.Source
	sink *handOvers
}

func (s *handOverSource) Run(ctx context.Context, sink runner.Sink) error {
	s.sink.Sink = sink
	return s.Source.Run(ctx, s.sink)
}

// TestHandOverManyPartitions: the fetchers of many partitions hand over
// together. While the runner takes one hand-over, the other partitions'
// fetches wait in one queue, and the next hand-over carries all of them
// (within the runner's budget), so the hand-overs a fetch round costs do
// not grow with the partitions assigned. Before, every fetcher handed its
// own partition over under one mutex: a hand-over per partition per fetch.
func TestHandOverManyPartitions(t *testing.T) {
	t.Parallel()
	const partitions, per = 64, 5
	c := kafkatest.NewFake(t, kfake.SeedTopics(partitions, "many"))
	produce(c, "many", partitions, per)
	fetches := watchFetches(c, "many", partitions)

	src := newSource(t, c, "many", kafkago.MaxWait(100*time.Millisecond))
	sink := &handOvers{release: make(chan struct{}), entered: make(chan struct{})}
	l := kafkatest.NewLedger()
	m := kafkatest.Start(t, "", &handOverSource{Source: src, sink: sink}, 10*time.Second, runner.Handle("many", l.Handler("", nil)),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(20*time.Millisecond))
	defer m.Stop(t)

	// Hold the first hand-over until the broker answered every
	// partition's first fetch.
	<-sink.entered
	select {
	case <-fetches.first:
	case <-time.After(10 * time.Second):
		t.Fatal("not every partition was fetched within 10s")
	}
	close(sink.release)
	kafkatest.WaitFor(t, 10*time.Second, "every record handled", func() bool { return l.Count() == partitions*per })
	if err := l.ExactlyOnce("many", kafkatest.Uniform(partitions, per)); err != nil {
		t.Fatal(err)
	}
	calls, total := sink.seen()
	t.Logf("%d records of %d partitions in %d hand-overs carrying %v partitions", total, partitions, len(calls), calls)
	if len(calls) > partitions/4 {
		t.Fatalf("%d hand-overs for %d partitions of %d records each (partitions per hand-over %v): hand-overs grow with the partitions",
			len(calls), partitions, per, calls)
	}
}

// pauseCounter counts the runner's Pause calls per partition.
type pauseCounter struct {
	*kafkago.Source
	mu     sync.Mutex
	pauses map[runner.TP]int
}

func (p *pauseCounter) Pause(tps []runner.TP) {
	p.mu.Lock()
	for _, tp := range tps {
		p.pauses[tp]++
	}
	p.mu.Unlock()
	p.Source.Pause(tps)
}

// TestPauseKeepsFetched: a paused partition keeps what its fetcher
// fetched, and fetches nothing until it is resumed and all of it was
// handed over. With water marks far below what one fetch brings, the
// runner pauses each partition many times, and still each partition's
// records are fetched once. (Before, a pause dropped the fetch, and each
// resume fetched the rest again: a fetch per pause.)
func TestPauseKeepsFetched(t *testing.T) {
	t.Parallel()
	const partitions, per = 3, 300
	c := kafkatest.NewFake(t, kfake.SeedTopics(partitions, "paused"))
	produce(c, "paused", partitions, per)
	fetches := watchFetches(c, "paused", partitions)

	src := newSource(t, c, "paused", kafkago.MaxWait(100*time.Millisecond))
	pc := &pauseCounter{Source: src, pauses: map[runner.TP]int{}}
	l := kafkatest.NewLedger()
	m := kafkatest.Start(t, "", pc, 10*time.Second, runner.Handle("paused", l.Handler("", func(context.Context, runner.Record) error { time.Sleep(100 * time.Microsecond); return nil })),
		runner.Logger(kafkatest.Logger(t)), runner.CommitInterval(20*time.Millisecond),
		runner.WaterMarks(20, 10), runner.Concurrency(4))
	kafkatest.WaitFor(t, 20*time.Second, "every record handled", func() bool { return l.Count() == partitions*per })
	m.Stop(t)
	if err := l.ExactlyOnce("paused", kafkatest.Uniform(partitions, per)); err != nil {
		t.Fatal(err)
	}
	fetches.mu.Lock()
	defer fetches.mu.Unlock()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for p := range int32(partitions) {
		before := 0 // fetches at an offset below the end: each brings records
		for off, n := range fetches.at[p] {
			if off < per {
				before += n
			}
		}
		paused := pc.pauses[runner.TP{Topic: "paused", Partition: p}]
		t.Logf("partition %d: paused %d times, %d fetches below the end", p, paused, before)
		if paused < 5 {
			t.Errorf("partition %d paused %d times: the water marks did not bind, nothing was tested", p, paused)
		}
		if before > 2 {
			t.Errorf("partition %d: %d fetches for %d records held in one fetch's worth: pauses refetch", p, before, per)
		}
	}
}

// budgetSink answers every hand-over with the same budget and keeps
// nothing.
type budgetSink struct {
	runner.Sink
	budget int
}

func (s budgetSink) Fetched(context.Context, []runner.Batch) (int, error) { return s.budget, nil }

// BenchmarkHandOver: handing 120,000 fetched records to the runner costs
// the same per record whether they come from 12, 120 or 1,200 partitions
// (the runner's budget, 5,000, sets the hand-overs: 24 per round).
func BenchmarkHandOver(b *testing.B) {
	const total, budget = 120_000, 5000
	for _, parts := range []int{12, 120, 1200} {
		b.Run(strconv.Itoa(parts)+"_partitions", func(b *testing.B) {
			b.ReportAllocs()
			calls := 0
			for b.Loop() {
				b.StopTimer() // building the fetched records is not handing them over
				round := kafkago.HandOverRound(budgetSink{budget: budget}, parts, total/parts, budget)
				b.StartTimer()
				calls = round()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*total), "ns/record")
			b.ReportMetric(float64(calls), "handovers/round")
		})
	}
}
