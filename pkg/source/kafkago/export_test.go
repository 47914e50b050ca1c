package kafkago

import (
	"context"
	"log/slog"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Decode exposes decode to the external tests, with each aborted
// transaction as {producer id, first offset}.
func Decode(tp runner.TP, records []byte, aborted [][2]int64, from int64) ([]runner.Record, int64, error) {
	var a []abortedTxn
	for _, x := range aborted {
		a = append(a, abortedTxn{producerID: x[0], firstOffset: x[1]})
	}
	d, err := decode(tp, records, a, from)
	return d.recs, d.end, err
}

// HandOverRound queues per records of each of parts partitions in a
// generation's hand-over, as their fetchers would, and returns a function
// that runs the hand-over into sink until it took them all and returns how
// many Fetched calls that took. budget is the runner's budget throughout.
func HandOverRound(sink runner.Sink, parts, per, budget int) func() int {
	s := &Source{log: slog.New(slog.DiscardHandler), budget: budget}
	calls := &callCounter{Sink: sink}
	h := newHandover(s, calls)
	fs := make([]*fetcher, parts)
	for i := range fs {
		recs := make([]runner.Record, per)
		for j := range recs {
			recs[j] = runner.Record{Topic: "t", Partition: int32(i), Offset: int64(j)}
		}
		fs[i] = newFetcher(s, h, runner.TP{Topic: "t", Partition: int32(i)}, 0, fetchSize{bytes: 1, memory: 1})
		fs[i].held = &held{recs: recs, end: int64(per), hwm: int64(per)}
		fs[i].state = queued
		h.queue.pushBack(fs[i])
	}
	return func() int {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { h.run(ctx); close(done) }()
		for _, f := range fs {
			<-f.taken
		}
		cancel()
		<-done
		return calls.n
	}
}

type callCounter struct {
	runner.Sink
	n int
}

func (c *callCounter) Fetched(ctx context.Context, b []runner.Batch) (int, error) {
	c.n++
	return c.Sink.Fetched(ctx, b)
}

// RefusedForTest is refused: whether a write error is one the same
// message meets on every retry.
func RefusedForTest(err error) bool { return refused(err) }
