package kafkago

import (
	"context"
	"errors"
	"fmt"
	"time"

	kafka "github.com/segmentio/kafka-go"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/tidemark/tidemark/internal/backoff"
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

// fetcher fetches one partition for one generation and queues what it
// fetched for the generation's hand-over (handover.go), one fetch at a
// time: it fetches again once the runner took every record of the last.
type fetcher struct {
	s  *Source
	h  *handover
	tp runner.TP

	next int64 // the offset after everything handed to the runner
	held *held // fetched, not yet handed over (at most one fetch's worth)

	// size is the PartitionMaxBytes of the next fetch; maxSize its most
	// and perFetch the memory one fetch may take (see LimitFetch). Owned
	// by the fetcher's goroutine.
	size, maxSize int32
	perFetch      int64

	// Guarded by handover.mu.
	paused       bool
	state        int
	qprev, qnext *fetcher

	wake  chan struct{} // capacity 1: a Resume happened
	taken chan struct{} // capacity 1: the hand-over took every held record
}

// held is the part of one fetch the runner has not taken yet.
type held struct {
	recs []runner.Record
	end  int64 // the next fetch offset once every record in recs is handed over
	hwm  int64
}

func newFetcher(s *Source, h *handover, tp runner.TP, start int64, size fetchSize) *fetcher {
	return &fetcher{
		s: s, h: h, tp: tp, next: start,
		size: size.bytes, maxSize: size.bytes, perFetch: size.memory,
		wake: make(chan struct{}, 1), taken: make(chan struct{}, 1),
	}
}

// run fetches and queues until ctx is done or the hand-over stopped. It
// returns nil then, and a *FetchError for a fatal fetch error.
func (f *fetcher) run(ctx context.Context) error {
	log := f.s.log.With("partition", f.tp.String())
	failures := 0
	for ctx.Err() == nil {
		if !f.h.waitUnpaused(ctx, f) {
			return nil
		}
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
			sleep(ctx, retryWait(failures))
			continue
		case !progress:
			// The answer held record bytes but no whole batch ending at
			// or after next: a broker that does not send an oversized
			// first batch whole (KIP-74). Asking again at once would
			// spin.
			log.Warn("fetch answer moved nothing; retrying after MaxWait", "offset", f.next, "fetch_bytes", f.size)
			sleep(ctx, f.s.cfg.maxWait)
			continue
		}
		failures = 0
		if h == nil {
			continue // the long poll ended with nothing new
		}
		if !f.h.offer(ctx, f, h) {
			return nil
		}
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
			MaxBytes:       f.size,
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
					PartitionMaxBytes:  f.size,
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
	f.resize(int64(len(a.frame)), int64(len(a.frame))+d.held)
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

// retryWait is the wait before retry n (from 1) of a fetch or an offset
// look-up: 100ms doubling up to 2s, without jitter.
func retryWait(n int) time.Duration {
	return backoff.Exponential(100*time.Millisecond, 2*time.Second, n)
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
