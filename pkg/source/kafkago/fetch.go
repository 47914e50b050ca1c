package kafkago

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	kafka "github.com/segmentio/kafka-go"
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
// response's list of aborted transactions, and every kafka-go decoder drops
// a batch's last offset. So each fetcher sends its own fetch request
// through a kafka.Transport (which routes it to the partition's leader) and
// reads and filters the answer itself, as the Java consumer does; see
// wire.go and decode.

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
				// The answer held record bytes but no whole batch ending at
				// or after next: a broker that does not send an oversized
				// first batch whole (KIP-74). Asking again at once would
				// spin.
				log.Warn("fetch answer moved nothing; retrying after MaxWait", "offset", f.next, "fetch_bytes", f.s.cfg.maxBytes)
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
// nothing), and progress false when the answer had record bytes that did
// not move the position.
func (f *fetcher) fetch(ctx context.Context) (*held, bool, error) {
	s := f.s
	call := &fetchCall{
		clientID: s.cfg.dialer.ClientID,
		req: fetchapi.Request{
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
		},
	}
	m, err := s.tr.RoundTrip(ctx, s.addr, call)
	if err != nil {
		return nil, true, err
	}
	c, ok := m.(*fetchCall)
	if !ok || c.answer == nil {
		return nil, true, fmt.Errorf("kafkago: fetch answered with %T", m)
	}
	a := c.answer
	if a.errorCode != 0 {
		return nil, true, kafka.Error(a.errorCode)
	}
	var part *answerPartition
	for i := range a.partitions {
		if p := &a.partitions[i]; p.topic == f.tp.Topic && p.partition == f.tp.Partition {
			part = p
		}
	}
	if part == nil {
		return nil, true, errors.New("kafkago: the fetch answer does not include the partition")
	}
	if part.errorCode != 0 {
		err := kafka.Error(part.errorCode)
		if errors.Is(err, kafka.OffsetOutOfRange) {
			return nil, true, f.outOfRange(ctx)
		}
		return nil, true, err
	}
	d, err := decode(f.tp, part.records, part.aborted, f.next)
	if err != nil {
		return nil, true, err
	}
	if d.end == f.next {
		// Every whole batch ends at or after the offset asked for, so
		// only an answer with no whole batch leaves the position where
		// it was.
		return nil, len(part.records) == 0, nil
	}
	return &held{recs: d.recs, end: d.end, hwm: part.highWatermark}, true, nil
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
