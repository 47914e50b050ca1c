package share

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/kgocontact"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/kgorec"
)

// session is one share session: one franz-go client, one goroutine (run)
// that polls, hands over, and waits for its records to be settled.
type session struct {
	src  *Source
	id   int
	cl   *kgo.Client
	idle time.Duration // the client's ConnIdleTimeout
	// contact is the coordinator's last answer to this session
	// (Membership); a kgo hook of cl.
	contact *kgocontact.Contact

	// held is this session's unsettled records (under src.mu): handed to
	// the runner, or copies of records the runner holds from another
	// delivery.
	held map[recKey]*kgo.Record
	wake chan struct{} // capacity 1: held emptied, or the flow resumed

	lockFor time.Duration // the lock duration, as learnt from the polls
	// soonest is the least lock time left on a record of the last poll
	// when it returned (0: none known).
	soonest time.Duration
}

func (ss *session) signal() {
	select {
	case ss.wake <- struct{}{}:
	default:
	}
}

// pollBackoff is the wait after a poll that failed.
const pollBackoff = time.Second

// minRenew is the shortest renewal period.
const minRenew = 100 * time.Millisecond

// run polls until ctx ends. It never polls while a record of its previous
// poll is unsettled: franz-go's next poll would accept it (see
// kgo's finalizePreviousPoll).
func (ss *session) run(ctx context.Context, sink runner.Sink) {
	budget, err := sink.Fetched(ctx, nil)
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		if !ss.waitFlow(ctx) {
			return
		}
		fs := ss.cl.PollRecords(ctx, max(min(ss.src.cfg.maxPollRecords, budget), 1))
		polled := time.Now()
		failed := false
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrClientClosed) {
				return
			}
			failed = true
			ss.src.log.Warn("share fetch failed", "session", ss.id, "topic", topic, "partition", p, "err", err)
		})
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) == 0 {
			if failed && !sleep(ctx, pollBackoff) {
				return
			}
			continue
		}
		batches, tps := ss.take(recs, polled)
		if err := ss.src.report(ctx, sink, tps); err != nil {
			ss.release(recs)
			ss.drain(ctx)
			return
		}
		if len(batches) > 0 {
			budget, err = sink.Fetched(ctx, batches)
			if err != nil {
				// The runner is stopping: it took none of them.
				ss.release(recs)
				ss.drain(ctx)
				return
			}
		}
		ss.waitSettled(ctx)
	}
}

// drain keeps renewing what the session still holds (copies of records
// the runner runs) until it is settled or ctx ends.
func (ss *session) drain(ctx context.Context) {
	ss.waitSettled(ctx)
	<-ctx.Done()
}

// take registers a poll's records as held and groups them into batches by
// partition. A record whose lock has already expired is released and left
// out: the broker has made it, or will make it, available again. A record
// the runner already holds from an earlier delivery is kept as a copy of
// it, not handed over again. It returns the batches and their partitions.
func (ss *session) take(recs []*kgo.Record, now time.Time) ([]runner.Batch, []runner.TP) {
	s := ss.src
	var batches []runner.Batch
	idx := map[runner.TP]int{}
	stale, joined := 0, 0
	lock := time.Duration(0)
	s.mu.Lock()
	for _, r := range recs {
		tp := runner.TP{Topic: r.Topic, Partition: r.Partition}
		k := recKey{tp, r.Offset}
		if dl := r.AcquisitionDeadline(); !dl.IsZero() {
			if !now.Before(dl) {
				r.Ack(kgo.AckRelease)
				stale++
				continue
			}
			if d := dl.Sub(now); lock == 0 || d < lock {
				lock = d
			}
		}
		ss.held[k] = r
		if h := s.held[k]; h != nil {
			h.copies = append(h.copies, heldCopy{ss, r})
			joined++
			continue
		}
		s.held[k] = &heldRec{copies: []heldCopy{{ss, r}}}
		i, ok := idx[tp]
		if !ok {
			i = len(batches)
			idx[tp] = i
			batches = append(batches, runner.Batch{TP: tp, Position: -1, HighWatermark: -1})
		}
		batches[i].Records = append(batches[i].Records, toRunner(r))
	}
	s.mu.Unlock()
	ss.soonest = lock
	if lock > 0 && (ss.lockFor == 0 || lock > ss.lockFor) {
		// The longest remaining lock seen is the closest to the lock
		// duration (a poll's records were acquired at its fetch).
		ss.lockFor = lock
	}
	if stale > 0 {
		s.log.Warn("records polled after their lock expired; released, not run", "session", ss.id, "records", stale)
	}
	if joined > 0 {
		s.log.Warn("records delivered again while the runner still holds them; settled with them", "session", ss.id, "records", joined)
	}
	tps := make([]runner.TP, 0, len(batches))
	for _, b := range batches {
		tps = append(tps, b.TP)
	}
	return batches, tps
}

// release settles recs as released where the session still holds them
// (the runner did not take them).
func (ss *session) release(recs []*kgo.Record) {
	s := ss.src
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		k := recKey{runner.TP{Topic: r.Topic, Partition: r.Partition}, r.Offset}
		if ss.held[k] != r {
			continue
		}
		delete(ss.held, k)
		h := s.held[k]
		if h == nil {
			continue
		}
		if h.copies[0].rec == r {
			// Handed over by this poll: the runner did not take it, and
			// neither did anyone else.
			for _, c := range h.copies {
				c.rec.Ack(kgo.AckRelease)
				if c.s != ss {
					delete(c.s.held, k)
					if len(c.s.held) == 0 {
						c.s.signal()
					}
				}
			}
			delete(s.held, k)
			continue
		}
		// A copy of a record the runner holds: it stays a copy.
		ss.held[k] = r
	}
}

// waitSettled waits until every record the session holds is settled,
// renewing their locks meanwhile, or until ctx ends.
func (ss *session) waitSettled(ctx context.Context) {
	period := ss.renewPeriod()
	first := period
	if ss.soonest > 0 {
		// The first renewal must beat the soonest lock of this poll,
		// which can be shorter than the lock duration (a record fetched
		// while the previous poll returned).
		first = max(min(period, ss.soonest/2), minRenew)
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		ss.src.mu.Lock()
		n := len(ss.held)
		ss.src.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ss.wake:
		case <-t.C:
			ss.renew(ctx, period)
			t.Reset(period)
		case <-ctx.Done():
			return
		}
	}
}

// renewPeriod is a third of the earlier of the lock duration and the
// connection idle timeout: the broker releases a session's records when
// its lock expires or its connection closes, and franz-go closes a
// connection idle for ConnIdleTimeout (renewals go on that connection).
func (ss *session) renewPeriod() time.Duration {
	d := ss.lockFor
	if ss.idle > 0 && (d == 0 || ss.idle < d) {
		d = ss.idle
	}
	if d == 0 {
		d = 30 * time.Second // Kafka's default lock duration
	}
	return max(d/3, minRenew)
}

// renew extends the lock of every record the session holds and sends the
// renewals at once (franz-go would send a lone ack only after its 1s ack
// timer), waiting at most period for them.
func (ss *session) renew(ctx context.Context, period time.Duration) {
	ss.src.mu.Lock()
	n := 0
	for _, r := range ss.held {
		// A record settled meanwhile has a terminal ack: the renew is a
		// no-op for it (franz-go renews only a record with no ack).
		r.Ack(kgo.AckRenew)
		n++
	}
	ss.src.mu.Unlock()
	if n == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, period)
	defer cancel()
	if err := ss.cl.FlushAcks(fctx); err != nil && ctx.Err() == nil {
		ss.src.log.Warn("renewing locks: acks not flushed in time", "session", ss.id, "records", n, "err", err)
	}
}

// onAcks logs the acks the broker refused (franz-go's ack callback).
func (ss *session) onAcks(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			ss.src.log.Warn("share ack refused; its records will be delivered again", "session", ss.id, "topic", r.Topic, "partition", r.Partition, "err", r.Err)
		}
	}
}

// waitFlow waits until no partition is paused; false if ctx ended.
func (ss *session) waitFlow(ctx context.Context) bool {
	for {
		ss.src.mu.Lock()
		n := len(ss.src.paused)
		ss.src.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-ss.wake:
		case <-ctx.Done():
			return false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// toRunner converts r with its delivery count; the runner copies the
// bytes it keeps.
func toRunner(r *kgo.Record) runner.Record {
	rec := kgorec.Record(r)
	rec.DeliveryCount = r.DeliveryCount()
	return rec
}
