package franz

import (
	"context"
	"errors"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/kgorec"
)

// holdCap is how many records a poll may take from the client: four times
// the runner's room (its last budget: the least room below a high water
// mark among its unpaused partitions) for each partition not paused, and at
// least MaxPollRecords. With fast handlers that is the client's whole
// buffered fetch, so the client sends its next fetch at once and fetching
// and decoding overlap with the runner's work; with slow ones it is little,
// so the client does not fetch and decode far ahead of a runner that cannot
// take the records (a poll of tiny records can decode to tens of MiB).
// Four: the no-op benchmark gained nothing more from sixteen, and
// TestBoundedMemory's heap grew from 21 to 59 MiB with it.
func (s *Source) holdCap(room int) int {
	open := s.own.count() - s.flow.pausedCount()
	return max(4*room*max(open, 1), s.cfg.maxPollRecords)
}

// poll waits for the client's next fetch and takes all of it. A Resume of a
// partition with parked records ends the wait early (woken).
func (s *Source) poll(ctx context.Context, most int) (fetches kgo.Fetches, woken bool) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !s.flow.startPoll(cancel) {
		return nil, true
	}
	fetches = s.cl.PollRecords(pctx, most)
	s.flow.endPoll()
	if ctx.Err() == nil && pctx.Err() != nil {
		// Woken by Resume: drop the client's report of the cancelled
		// poll; anything else it returned is taken as usual.
		woken = true
		fetches = slices.DeleteFunc(fetches, func(f kgo.Fetch) bool {
			return len(f.Topics) == 1 && len(f.Topics[0].Partitions) == 1 && f.Topics[0].Partitions[0].Err != nil &&
				errors.Is(f.Topics[0].Partitions[0].Err, context.Canceled) && len(f.Topics[0].Partitions[0].Records) == 0
		})
	}
	return fetches, woken
}

// batches turns one poll into one Batch per partition. It reports stop when
// ctx is done or the client was closed by Close, and a *FetchError for a
// fatal fetch error; other fetch errors are logged.
func (s *Source) batches(ctx context.Context, fetches kgo.Fetches) (out []runner.Batch, stop bool, err error) {
	fetches.EachError(func(topic string, partition int32, ferr error) {
		tp := runner.TP{Topic: topic, Partition: partition}
		switch {
		case errors.Is(ferr, context.Canceled) || errors.Is(ferr, context.DeadlineExceeded):
			if ctx.Err() != nil {
				stop = true
				return
			}
			s.log.Warn("fetch error", "partition", tp.String(), "err", ferr)
		case errors.Is(ferr, kgo.ErrClientClosed):
			if s.closing.Load() {
				stop = true
				return
			}
			if err == nil {
				err = &FetchError{Err: ferr}
			}
		case fatalFetch(ferr):
			if err == nil {
				err = &FetchError{TP: tp, Err: ferr}
			}
		default:
			var groupErr *kgo.ErrGroupSession
			var lossErr *kgo.ErrDataLoss
			switch {
			case errors.As(ferr, &groupErr):
				// franz-go rejoins by itself; the loss was reported
				// through OnPartitionsLost.
				s.log.Warn("group session ended by an error; rejoining", "err", ferr)
			case errors.As(ferr, &lossErr):
				s.log.Error("data loss detected by the client; it resets and continues", "partition", tp.String(), "err", ferr)
			default:
				s.log.Error("fetch error", "partition", tp.String(), "err", ferr)
			}
		}
	})
	if stop || err != nil {
		return nil, stop, err
	}
	var idx map[runner.TP]int
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		tp := runner.TP{Topic: p.Topic, Partition: p.Partition}
		i, ok := idx[tp]
		if !ok {
			if idx == nil {
				idx = make(map[runner.TP]int)
			}
			i = len(out)
			idx[tp] = i
			// A buffer of about the records' size: one far larger would
			// hold more than the memory bound counts (two polls' worth
			// of runner.Records at most, see LimitFetch).
			buf, need := s.recordBuf(), len(p.Records)
			if cap(buf) < need || cap(buf) > 2*need {
				buf = make([]runner.Record, 0, need)
			}
			out = append(out, runner.Batch{TP: tp, Position: -1, HighWatermark: -1, Records: buf})
		}
		b := &out[i]
		b.HighWatermark = max(b.HighWatermark, p.HighWatermark)
		for _, r := range p.Records {
			// Every record, control or not, moves the position: the
			// next fetch starts after it.
			b.Position = max(b.Position, r.Offset+1)
			if r.Attrs.IsControl() {
				continue
			}
			b.Records = append(b.Records, kgorec.Record(r))
		}
	})
	if len(out) > 0 {
		// Buffers this poll did not need are dropped: kept, they would
		// hold the records of two polls. (A poll with no records, woken
		// by a resume, keeps them for the next.)
		clear(s.recBufs)
		s.recBufs = s.recBufs[:0]
	}
	return out, false, nil
}

// recordBuf returns an empty record buffer to reuse, or nil.
func (s *Source) recordBuf() []runner.Record {
	if n := len(s.recBufs); n > 0 {
		b := s.recBufs[n-1]
		s.recBufs[n-1] = nil // not kept alive past len
		s.recBufs = s.recBufs[:n-1]
		return b
	}
	return nil
}

// reuse keeps the batches' record buffers for the next poll once the runner
// has copied their records, cleared: their records point into the fetch's
// buffers, which must not stay alive while the client fetches the next
// (the memory bound counts one poll in hand, see LimitFetch). A buffer
// this poll filled less than half is dropped, and the next poll drops those
// it does not use (batches), so that what is kept stays within twice one
// poll's records: buffers grown by earlier, larger polls would otherwise
// pile up.
func (s *Source) reuse(batches []runner.Batch) {
	for _, b := range batches {
		if cap(b.Records) > 0 && cap(b.Records) <= 2*len(b.Records) {
			clear(b.Records)
			s.recBufs = append(s.recBufs, b.Records[:0])
		}
	}
}

// fatalFetch reports whether a fetch error cannot go away without the
// operator: authentication and authorization failures, and a session
// timeout the broker does not allow (the member could never join).
func fatalFetch(err error) bool {
	for _, e := range []error{
		kerr.InvalidSessionTimeout,
		kerr.SaslAuthenticationFailed,
		kerr.TopicAuthorizationFailed,
		kerr.GroupAuthorizationFailed,
		kerr.ClusterAuthorizationFailed,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
