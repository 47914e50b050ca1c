package kafkago

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Why the adapter sends its own fetch requests instead of using a
// kafka.Reader (or kafka.Conn's batches, which the Reader reads): kafka-go's
// message reader never looks at a batch's control or transactional
// attributes, so with IsolationLevel ReadCommitted a Reader still delivers
// the records of aborted transactions and the transaction markers
// themselves as messages (the broker sends both; filtering them is the
// client's job). kafka.Client.Fetch skips control batches but drops the
// response's list of aborted transactions. So each fetcher sends a
// protocol/fetch request through a kafka.Transport (which routes it to the
// partition's leader) and filters the answer as the Java consumer does; see
// decode.

// fetcher fetches one partition for one generation. Its goroutine owns next
// and held; Pause and Resume touch only paused and wake.
type fetcher struct {
	s  *Source
	tp runner.TP

	next int64 // the offset after everything handed to the runner
	held *held // fetched, not yet handed over (at most one fetch's worth)

	paused atomic.Bool
	wake   chan struct{} // capacity 1: a Resume happened
}

// held is the part of one fetch the runner has not taken yet.
type held struct {
	recs []runner.Record
	end  int64 // the next fetch offset once every record in recs is handed over
	hwm  int64
}

func newFetcher(s *Source, tp runner.TP, start int64) *fetcher {
	return &fetcher{s: s, tp: tp, next: start, wake: make(chan struct{}, 1)}
}

func (f *fetcher) pause() { f.paused.Store(true) }

func (f *fetcher) resume() {
	f.paused.Store(false)
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// errSinkStopped ends a fetcher once the runner is stopping.
var errSinkStopped = errors.New("kafkago: runner stopping")

// run fetches and hands over until ctx is done. It returns nil then, or when
// the runner is stopping, and a *FetchError for a fatal fetch error.
func (f *fetcher) run(ctx context.Context, sink runner.Sink) error {
	log := f.s.log.With("partition", f.tp.String())
	failures := 0
	for ctx.Err() == nil {
		if f.paused.Load() {
			// Drop what we hold: resuming fetches again from next, the
			// offset after the last record the runner took.
			f.held = nil
			select {
			case <-f.wake:
			case <-ctx.Done():
			}
			continue
		}
		if f.held == nil {
			h, progress, err := f.fetch(ctx)
			switch {
			case err != nil:
				if ctx.Err() != nil {
					return nil
				}
				if fatalFetch(err) {
					return &FetchError{TP: f.tp, Err: err}
				}
				failures++
				log.Warn("fetch failed; retrying", "offset", f.next, "attempt", failures, "err", err)
				sleep(ctx, backoff(failures))
				continue
			case !progress:
				// The answer had batches but nothing at or after next:
				// the rest of a batch whose last records were compacted
				// away (kafka-go does not expose a batch's last offset).
				// Wait rather than ask again at once.
				sleep(ctx, f.s.cfg.maxWait)
				continue
			}
			failures = 0
			if h == nil {
				continue // the long poll ended with nothing new
			}
			f.held = h
		}
		if err := f.handOver(ctx, sink); err != nil {
			if errors.Is(err, errSinkStopped) || ctx.Err() != nil {
				return nil
			}
			// The sink never fails otherwise; stop this partition loudly.
			log.Error("runner refused records; fetching stops for this partition", "err", err)
			return nil
		}
	}
	return nil
}

// handOver gives the runner what the fetcher holds, at most the budget the
// runner returned last time. Hand-overs of every fetcher are serialized by
// handMu: the budget is for the next hand-over, whichever partition it is
// for, and the runner's answer to one must be known before the next.
func (f *fetcher) handOver(ctx context.Context, sink runner.Sink) error {
	s := f.s
	s.handMu.Lock()
	defer s.handMu.Unlock()
	// Checked under handMu: a Pause the runner made while answering the
	// previous hand-over is seen here.
	if f.paused.Load() || ctx.Err() != nil {
		return nil
	}
	h := f.held
	b := runner.Batch{TP: f.tp, Records: h.recs, Position: h.end, HighWatermark: h.hwm}
	if n := s.budget; len(h.recs) > n {
		b.Records = h.recs[:n]
		b.Position = h.recs[n-1].Offset + 1
	}
	budget, err := sink.Fetched(ctx, []runner.Batch{b})
	if err != nil {
		if errors.Is(err, runner.ErrStopped) {
			return errSinkStopped
		}
		// ctx ended before the runner took the records: nothing was
		// delivered; the fetcher is stopping.
		return err
	}
	s.budget = max(budget, 1)
	f.next = b.Position
	if rest := h.recs[len(b.Records):]; len(rest) > 0 {
		h.recs = rest
	} else {
		f.held = nil
	}
	return nil
}

// fetch sends one fetch request at next. It returns what is new (nil if
// nothing), and progress false when the answer had record batches but none
// of them moved the position.
func (f *fetcher) fetch(ctx context.Context) (*held, bool, error) {
	s := f.s
	req := &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(s.cfg.maxWait / time.Millisecond),
		MinBytes:       int32(s.cfg.minBytes),
		MaxBytes:       int32(s.cfg.maxBytes),
		IsolationLevel: int8(kafka.ReadCommitted),
		// A full fetch outside any fetch session (KIP-227), as
		// kafka.Client.Fetch sends it.
		SessionID:    -1,
		SessionEpoch: -1,
		Topics: []fetchapi.RequestTopic{{
			Topic: f.tp.Topic,
			Partitions: []fetchapi.RequestPartition{{
				Partition:          f.tp.Partition,
				CurrentLeaderEpoch: -1,
				FetchOffset:        f.next,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(s.cfg.maxBytes),
			}},
		}},
	}
	m, err := s.tr.RoundTrip(ctx, s.addr, req)
	if err != nil {
		return nil, true, err
	}
	resp, ok := m.(*fetchapi.Response)
	if !ok {
		return nil, true, fmt.Errorf("kafkago: fetch answered with %T", m)
	}
	if resp.ErrorCode != 0 {
		return nil, true, kafka.Error(resp.ErrorCode)
	}
	var part *fetchapi.ResponsePartition
	for i := range resp.Topics {
		t := &resp.Topics[i]
		for j := range t.Partitions {
			if t.Topic == f.tp.Topic && t.Partitions[j].Partition == f.tp.Partition {
				part = &t.Partitions[j]
			}
		}
	}
	if part == nil {
		return nil, true, errors.New("kafkago: the fetch answer does not include the partition")
	}
	if part.ErrorCode != 0 {
		err := kafka.Error(part.ErrorCode)
		if errors.Is(err, kafka.OffsetOutOfRange) {
			return nil, true, f.outOfRange(ctx)
		}
		return nil, true, err
	}
	recs, end, batches := decode(f.tp, part, f.next)
	if end == f.next {
		return nil, batches == 0, nil
	}
	return &held{recs: recs, end: end, hwm: part.HighWatermark}, true, nil
}

// outOfRange handles OFFSET_OUT_OF_RANGE: below the log start (retention
// deleted the records) the fetcher jumps to the log start and says so
// loudly; beyond the end it waits and asks again, never moving backward
// within an assignment.
func (f *fetcher) outOfRange(ctx context.Context) error {
	first, err := f.s.listOffset(ctx, f.tp, kafka.FirstOffset)
	if err != nil {
		return fmt.Errorf("kafkago: offset %d out of range, and the log start is unknown: %w", f.next, err)
	}
	if f.next < first {
		f.s.log.Error("records deleted before they were consumed (retention); skipping to the log start",
			"partition", f.tp.String(), "from", f.next, "to", first, "skipped", first-f.next)
		f.next = first
		return nil
	}
	return fmt.Errorf("kafkago: offset %d beyond the end of %s: %w", f.next, f.tp, kafka.OffsetOutOfRange)
}

// decode turns one partition's fetch answer into the records to deliver,
// read_committed: it drops control batches (transaction markers) and the
// batches of aborted transactions, as the Java consumer does, and skips
// records before from (a batch can start before the offset asked for). end
// is the next fetch offset: past every record and marker seen, so it moves
// over markers and aborted records and the committed offset can reach the
// end of a transactional partition. batches counts the record batches
// seen.
func decode(tp runner.TP, part *fetchapi.ResponsePartition, from int64) (recs []runner.Record, end int64, batches int) {
	end = from
	if part.RecordSet.Records == nil {
		return nil, end, 0
	}
	var readers []protocol.RecordReader
	if st, ok := part.RecordSet.Records.(*protocol.RecordStream); ok {
		readers = st.Records
	} else {
		readers = []protocol.RecordReader{part.RecordSet.Records}
	}
	aborted := slices.Clone(part.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b fetchapi.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	abortedPIDs := map[int64]bool{}
	for _, rr := range readers {
		batches++
		switch b := rr.(type) {
		case *protocol.ControlBatch:
			cr, err := b.ReadControlRecord()
			if err != nil {
				end = max(end, b.BaseOffset+1)
				continue
			}
			end = max(end, cr.Offset+1)
			// Type 0 is ABORT: the producer's aborted transaction ends
			// here; its later batches are live again.
			if cr.Type == 0 {
				delete(abortedPIDs, b.ProducerID)
			}
		case *protocol.RecordBatch:
			batch := readAll(tp, b, b.PartitionLeaderEpoch)
			last := b.BaseOffset
			if n := len(batch); n > 0 {
				last = batch[n-1].Offset
			}
			for len(aborted) > 0 && aborted[0].FirstOffset <= last {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			skip := b.Attributes.Transactional() && abortedPIDs[b.ProducerID]
			for _, r := range batch {
				end = max(end, r.Offset+1)
				if !skip && r.Offset >= from {
					recs = append(recs, r)
				}
			}
		default:
			// Magic v0/v1 message sets: no transactions.
			for _, r := range readAll(tp, rr, -1) {
				end = max(end, r.Offset+1)
				if r.Offset >= from {
					recs = append(recs, r)
				}
			}
		}
	}
	return recs, end, batches
}

// readAll reads every record of one batch, copying keys, values and headers
// out of kafka-go's pooled buffers.
func readAll(tp runner.TP, rr protocol.RecordReader, leaderEpoch int32) []runner.Record {
	var out []runner.Record
	for {
		r, err := rr.ReadRecord()
		if err != nil {
			// io.EOF, or a batch cut short (the answer hit MaxBytes): its
			// missing records come again with the next fetch.
			return out
		}
		rec := runner.Record{
			Topic:       tp.Topic,
			Partition:   tp.Partition,
			Offset:      r.Offset,
			Key:         bytesOf(r.Key),
			Value:       bytesOf(r.Value),
			Timestamp:   r.Time,
			LeaderEpoch: leaderEpoch,
		}
		if len(r.Headers) > 0 {
			rec.Headers = make([]runner.Header, len(r.Headers))
			for i, h := range r.Headers {
				rec.Headers[i] = runner.Header{Key: h.Key, Value: h.Value}
			}
		}
		out = append(out, rec)
	}
}

// bytesOf copies b (nil for a null key or value) and releases it.
func bytesOf(b protocol.Bytes) []byte {
	if b == nil {
		return nil
	}
	defer b.Close()
	out, err := protocol.ReadAll(b)
	if err != nil {
		return nil
	}
	return out
}

// fatalFetch reports whether a fetch error cannot go away without the
// operator.
func fatalFetch(err error) bool {
	for _, e := range []error{
		kafka.TopicAuthorizationFailed,
		kafka.ClusterAuthorizationFailed,
		kafka.SASLAuthenticationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// backoff is the wait before retry n (from 1): 100ms doubling up to 2s.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n-1, 5)
	return min(d, 2*time.Second)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
