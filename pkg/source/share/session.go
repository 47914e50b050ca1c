package share

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	// maxWait is the client's FetchMaxWait: how long a share fetch may
	// wait at the broker for records.
	maxWait time.Duration
	// flight counts the session's share fetches on the wire; a kgo hook
	// of cl.
	flight *fetchFlight
	// contact is the coordinator's last answer to this session
	// (Membership); a kgo hook of cl.
	contact *kgocontact.Contact

	// held is this session's unsettled records (under src.mu): handed to
	// the runner, waiting to be handed over, or copies of records the
	// runner holds from another delivery.
	held map[recKey]*lockedRec
	wake chan struct{} // capacity 1: a record settled, or the flow resumed

	// ahead is the records the client has buffered and no poll has
	// returned yet (under src.mu; kept by aheadHook): a fetch that
	// slipped out as a poll returned. Their locks run from their fetch,
	// so the session renews them with what it holds, while it waits for
	// its records to settle or for the runner to resume, and take uses
	// the lock end those renewals moved on. A poll's own fetch passes
	// through here too, for as long as the client buffers it.
	ahead map[*kgo.Record]*lockedRec
	// aheadAt counts ahead's records by partition and offset (under
	// src.mu; addAhead and dropAhead keep both), so that an ack can ask
	// whether the client holds a newer acquisition of its record without
	// a walk of ahead.
	aheadAt map[recKey]int

	// Acks for acquisitions whose lock may have expired are sent alone:
	// the broker refuses every ack of a partition in a request that holds
	// one for an expired acquisition (INVALID_RECORD_STATE), so a good
	// record's ACCEPT sent beside it would be lost and the record run
	// again. Under src.mu: stale is such acks not sent yet; while
	// isolating, the session is sending them, and Settle queues every
	// other ack of this session in deferred instead of marking it.
	stale     []pendingAck
	deferred  []pendingAck
	isolating bool
	// refused is the partitions whose acks the broker refused since the
	// last renewal began (under src.mu; set by onAcks).
	refused map[runner.TP]bool

	// pollCap, when above 0, polls fewer records than a fetch brings, as
	// the client's buffering does at random: tests set it.
	pollCap int

	// nextRenew is when the records held are renewed next (zero: at the
	// first renewal of a poll, by soonest); run goroutine only.
	nextRenew time.Time

	// lockFor is the lock duration, as learnt from the polls: written by
	// the run goroutine under src.mu (Settle reads it, through ack).
	lockFor time.Duration
	// soonest is the least lock time left on a record of the last poll
	// when it returned (0: none known).
	soonest time.Duration
}

// lockedRec is a record the session holds, and until when its lock is
// known to last: the deadline of its fetch, moved on by each renewal the
// broker took.
type lockedRec struct {
	rec   *kgo.Record
	until time.Time
}

// pendingAck is an ack the session has still to mark on its client.
type pendingAck struct {
	rec    *kgo.Record
	status kgo.AckStatus
}

// lockMargin is how long before its known end a lock is taken as expired:
// the broker's clock and the wire make the known end approximate, and an
// ack of an expired lock must not share a request with good ones. Taking
// a live lock as expired only costs a request of its own.
func (ss *session) lockMargin() time.Duration {
	return max(ss.lockFor/4, minRenew)
}

// expired reports whether l's lock may have expired at now.
func (ss *session) expired(l *lockedRec, now time.Time) bool {
	return !now.Before(l.until.Add(-ss.lockMargin()))
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
	if _, err := ss.src.handOver(ctx, sink, nil); err != nil {
		return
	}
	for ctx.Err() == nil {
		// While paused, what the client fetched ahead is renewed.
		if !ss.hold(ctx, ss.flowing) {
			return
		}
		// The whole fetch, whatever the budget: records the client kept
		// back would wait acquired, their locks running unrenewed, and
		// reach the delivery limit without a handler attempt. What the
		// budget does not allow yet waits here, renewed.
		fs := ss.cl.PollRecords(ctx, ss.pollSize())
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
		ss.nextRenew = time.Time{}
		batches, tps, stale := ss.take(recs, polled)
		if len(stale) > 0 {
			ss.releaseAlone(ctx, stale)
		}
		if err := ss.src.report(ctx, sink, tps); err != nil {
			ss.release(recs)
			ss.drain(ctx)
			return
		}
		for len(batches) > 0 {
			rest, err := ss.src.handOver(ctx, sink, batches)
			if err != nil {
				// The runner is stopping: it took none of these.
				ss.release(batchRecs(ss, batches))
				ss.drain(ctx)
				return
			}
			batches = rest
			if len(batches) > 0 && !ss.hold(ctx, ss.flowing) {
				return
			}
		}
		ss.waitSettled(ctx)
	}
}

// pollSize is how many records a poll takes: the whole fetch.
func (ss *session) pollSize() int {
	if ss.pollCap > 0 {
		return min(ss.pollCap, ss.src.cfg.maxPollRecords)
	}
	return ss.src.cfg.maxPollRecords
}

// splitBatches returns the first n records of batches, in order, and the
// rest.
func splitBatches(batches []runner.Batch, n int) (now, rest []runner.Batch) {
	n = max(n, 1)
	for i, b := range batches {
		if len(b.Records) < n {
			n -= len(b.Records)
			continue
		}
		head, tail := b, b
		head.Records = b.Records[:n:n]
		tail.Records = b.Records[n:]
		now = append(slices.Clone(batches[:i]), head)
		if len(tail.Records) > 0 {
			rest = append(rest, tail)
		}
		return now, append(rest, batches[i+1:]...)
	}
	return batches, nil
}

// batchRecs returns the client's records of batches (the session holds
// them).
func batchRecs(ss *session, batches []runner.Batch) []*kgo.Record {
	ss.src.mu.Lock()
	defer ss.src.mu.Unlock()
	var recs []*kgo.Record
	for _, b := range batches {
		for _, r := range b.Records {
			if l := ss.held[recKey{b.TP, r.Offset}]; l != nil {
				recs = append(recs, l.rec)
			}
		}
	}
	return recs
}

// flowing reports whether no partition is paused (under src.mu).
func (ss *session) flowing() bool { return len(ss.src.paused) == 0 }

// releaseAlone releases recs, acquisitions already expired, in requests
// of their own: first whatever else the client has to send goes, then
// these.
func (ss *session) releaseAlone(ctx context.Context, recs []*kgo.Record) {
	ss.src.mu.Lock()
	for _, r := range recs {
		ss.stale = append(ss.stale, pendingAck{r, kgo.AckRelease})
	}
	ss.src.mu.Unlock()
	ss.sendStale(ctx)
}

// sendStale sends the acks of acquisitions that may have expired, alone:
// it flushes what the client has pending, marks them, and flushes again;
// meanwhile Settle defers this session's other acks, marked after.
func (ss *session) sendStale(ctx context.Context) {
	s := ss.src
	s.mu.Lock()
	if len(ss.stale) == 0 {
		s.mu.Unlock()
		return
	}
	ss.isolating = true
	s.mu.Unlock()
	fctx, cancel := context.WithTimeout(ctx, ss.renewPeriod())
	defer cancel()
	err := ss.cl.FlushAcks(fctx)
	if err == nil {
		s.mu.Lock()
		acks := ss.stale
		ss.stale = nil
		for _, a := range acks {
			if !ss.reacquired(a.rec) {
				ackRecord(a.rec, a.status)
			}
		}
		s.mu.Unlock()
		err = ss.cl.FlushAcks(fctx)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("sending the acks of expired locks: not flushed in time", "session", ss.id, "err", err)
	}
	s.mu.Lock()
	ss.isolating = false
	ss.markDeferred()
	s.mu.Unlock()
}

// markDeferred marks the acks Settle deferred while the session sent its
// lone acks (under src.mu).
func (ss *session) markDeferred() {
	for _, a := range ss.deferred {
		ackRecord(a.rec, a.status)
	}
	ss.deferred = nil
}

// drain keeps renewing what the session still holds (copies of records
// the runner runs) until it is settled or ctx ends.
func (ss *session) drain(ctx context.Context) {
	ss.waitSettled(ctx)
	<-ctx.Done()
}

// take registers a poll's records as held and groups them into batches by
// partition. A record whose lock has already expired is left out and
// returned, to be released alone: the broker has made it, or will make it,
// available again. A record the runner already holds from an earlier
// delivery is kept as a copy of it, not handed over again (the earlier
// acquisition has expired). It returns the batches, their partitions and
// the expired records.
func (ss *session) take(recs []*kgo.Record, now time.Time) ([]runner.Batch, []runner.TP, []*kgo.Record) {
	s := ss.src
	var batches []runner.Batch
	idx := map[runner.TP]int{}
	var stale []*kgo.Record
	joined := 0
	lock := time.Duration(0)
	s.mu.Lock()
	for _, r := range recs {
		tp := runner.TP{Topic: r.Topic, Partition: r.Partition}
		k := recKey{tp, r.Offset}
		dl := acquisitionDeadline(r)
		if a := ss.ahead[r]; a != nil {
			// Renewed while the client buffered it.
			if a.until.After(dl) {
				dl = a.until
			}
			ss.dropAhead(r)
		}
		if !dl.IsZero() {
			// Within the margin the lock counts as expired: renew skips
			// it, so the record would run with its lock ending under
			// it, and its accept be refused and the record run again.
			if !now.Before(dl.Add(-ss.lockMargin())) {
				stale = append(stale, r)
				continue
			}
			if d := dl.Sub(now); lock == 0 || d < lock {
				lock = d
			}
		} else {
			dl = now.Add(ss.renewPeriod() * 3)
		}
		ss.held[k] = &lockedRec{rec: r, until: dl}
		if h := s.held[k]; h != nil {
			// The broker delivered it again: the earlier acquisitions
			// have expired, renewing them would have every renewal of
			// their partition refused.
			for _, c := range h.copies {
				if l := c.s.held[k]; l != nil && l.rec == c.rec {
					l.until = time.Time{}
				}
			}
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
	ss.soonest = lock
	if lock > 0 && (ss.lockFor == 0 || lock > ss.lockFor) {
		// The longest remaining lock seen is the closest to the lock
		// duration (a poll's records were acquired at its fetch).
		ss.lockFor = lock
	}
	s.mu.Unlock()
	if len(stale) > 0 {
		s.log.Warn("records polled after their lock expired; released, not run", "session", ss.id, "records", len(stale))
	}
	if joined > 0 {
		s.log.Warn("records delivered again while the runner still holds them; settled with them", "session", ss.id, "records", joined)
	}
	tps := make([]runner.TP, 0, len(batches))
	for _, b := range batches {
		tps = append(tps, b.TP)
	}
	return batches, tps, stale
}

// release settles recs as released where the session still holds them
// (the runner did not take them).
func (ss *session) release(recs []*kgo.Record) {
	s := ss.src
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		k := recKey{runner.TP{Topic: r.Topic, Partition: r.Partition}, r.Offset}
		l := ss.held[k]
		if l == nil || l.rec != r {
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
				c.s.ack(k, c.rec, kgo.AckRelease, time.Now())
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
		ss.held[k] = l
	}
}

// ack marks rec's ack with status, or queues it to be sent alone when its
// lock may have expired, or to be marked after the session's lone acks
// (under src.mu; k is still in ss.held).
func (ss *session) ack(k recKey, rec *kgo.Record, status kgo.AckStatus, now time.Time) {
	if ss.reacquired(rec) {
		// rec's acquisition has expired: the broker gave the record to
		// this session again. It takes acks by offset and member, so
		// rec's ack would settle the newer acquisition, or, sent beside
		// that one's, be refused with every ack of the partition in the
		// request. The newer acquisition's own ack settles the record.
		return
	}
	if l := ss.held[k]; l != nil && l.rec == rec && ss.expired(l, now) {
		ss.stale = append(ss.stale, pendingAck{rec, status})
		return
	}
	if ss.isolating {
		ss.deferred = append(ss.deferred, pendingAck{rec, status})
		return
	}
	ackRecord(rec, status)
}

// reacquired reports whether the session holds a newer acquisition of
// rec's offset than rec (under src.mu): a record of a later poll, or one
// the client fetched ahead. The broker delivers a record again only once
// the earlier acquisition expired, so rec's is gone, and an ack of rec
// (the broker takes acks by offset and member) would settle the newer
// one: a release of an expired record would make the record available
// while its newer copy runs. Acks of rec are dropped.
func (ss *session) reacquired(rec *kgo.Record) bool {
	k := recKey{runner.TP{Topic: rec.Topic, Partition: rec.Partition}, rec.Offset}
	if l := ss.held[k]; l != nil && l.rec != rec {
		return true
	}
	n := ss.aheadAt[k]
	if _, in := ss.ahead[rec]; in {
		n-- // rec itself
	}
	return n > 0
}

// addAhead notes r, buffered by the client and not polled, as held until
// until (under src.mu).
func (ss *session) addAhead(r *kgo.Record, until time.Time) {
	if _, in := ss.ahead[r]; !in {
		ss.aheadAt[recKey{runner.TP{Topic: r.Topic, Partition: r.Partition}, r.Offset}]++
	}
	ss.ahead[r] = &lockedRec{rec: r, until: until}
}

// dropAhead forgets r from ahead (under src.mu).
func (ss *session) dropAhead(r *kgo.Record) {
	if _, in := ss.ahead[r]; !in {
		return
	}
	delete(ss.ahead, r)
	k := recKey{runner.TP{Topic: r.Topic, Partition: r.Partition}, r.Offset}
	if ss.aheadAt[k]--; ss.aheadAt[k] <= 0 {
		delete(ss.aheadAt, k)
	}
}

// waitSettled waits until every record the session holds is settled,
// renewing their locks meanwhile, or until ctx ends.
func (ss *session) waitSettled(ctx context.Context) {
	ss.hold(ctx, func() bool { return len(ss.held) == 0 })
}

// hold waits until done (called under src.mu) reports true, renewing the
// locks of what the session holds and sending the acks of expired locks
// meanwhile; false if ctx ended first.
func (ss *session) hold(ctx context.Context, done func() bool) bool {
	period := ss.renewPeriod()
	first := period
	if ss.soonest > 0 {
		// The first renewal must beat the soonest lock of this poll,
		// which can be shorter than the lock duration (a record fetched
		// while the previous poll returned).
		first = max(min(period, ss.soonest/2), minRenew)
	}
	// The renewals keep their pace across the waits of one hand-over:
	// a timer started anew at each wait would starve the waiting
	// records' renewals whenever the runner resumes sooner than period.
	wait := first
	if !ss.nextRenew.IsZero() {
		wait = max(time.Until(ss.nextRenew), 0)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ss.sendStale(ctx)
		ss.src.mu.Lock()
		ok := done()
		ss.src.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ss.wake:
		case <-t.C:
			ss.renew(ctx, period)
			ss.nextRenew = time.Now().Add(period)
			t.Reset(period)
		case <-ctx.Done():
			return false
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
// A record whose lock may have expired is not renewed: a renewal of an
// expired acquisition has every ack of its partition in the request
// refused.
func (ss *session) renew(ctx context.Context, period time.Duration) {
	start := time.Now()
	ss.src.mu.Lock()
	var renewed []*lockedRec
	for _, l := range ss.held {
		if ss.expired(l, start) {
			continue
		}
		// A record settled meanwhile has a terminal ack: the renew is a
		// no-op for it (franz-go renews only a record with no ack).
		ackRecord(l.rec, kgo.AckRenew)
		renewed = append(renewed, l)
	}
	for _, l := range ss.ahead {
		// Buffered, not polled yet: its lock runs all the same.
		if ss.expired(l, start) {
			continue
		}
		ackRecord(l.rec, kgo.AckRenew)
		renewed = append(renewed, l)
	}
	clear(ss.refused)
	ss.src.mu.Unlock()
	if len(renewed) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, period)
	defer cancel()
	if err := ss.cl.FlushAcks(fctx); err != nil {
		if ctx.Err() == nil {
			ss.src.log.Warn("renewing locks: acks not flushed in time", "session", ss.id, "records", len(renewed), "err", err)
		}
		return
	}
	// The broker extends a lock from when it takes the renewal, after
	// start: start plus the lock duration is a safe end.
	ss.src.mu.Lock()
	defer ss.src.mu.Unlock()
	for _, l := range renewed {
		if !ss.refused[runner.TP{Topic: l.rec.Topic, Partition: l.rec.Partition}] && ss.lockFor > 0 {
			if end := start.Add(ss.lockFor); end.After(l.until) {
				l.until = end
			}
		}
	}
}

// onAcks logs the acks the broker refused, and notes their partitions for
// renew (franz-go's ack callback).
func (ss *session) onAcks(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			ss.src.mu.Lock()
			ss.refused[runner.TP{Topic: r.Topic, Partition: r.Partition}] = true
			ss.src.mu.Unlock()
			ss.src.tel.refused(r.Topic, r.Partition, r.Err)
			ss.src.log.Warn("share ack refused; its records will be delivered again", "session", ss.id, "topic", r.Topic, "partition", r.Partition, "err", r.Err)
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

// fetchFlight counts a client's share fetches written and not answered
// yet (the end hook runs once per request, after its answer or a failed
// write).
type fetchFlight struct{ n atomic.Int32 }

var (
	_ kgo.HookBrokerWrite = (*fetchFlight)(nil)
	_ kgo.HookBrokerE2E   = (*fetchFlight)(nil)
)

func (f *fetchFlight) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.ShareFetch) && err == nil {
		f.n.Add(1)
	}
}

func (f *fetchFlight) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if key == int16(kmsg.ShareFetch) && e.WriteErr == nil {
		f.n.Add(-1)
	}
}

// aheadHook keeps session.ahead: franz-go calls it as its client buffers
// a fetch's records and as a poll (or a release) takes them.
type aheadHook struct{ ss *session }

var (
	_ kgo.HookFetchRecordBuffered   = aheadHook{}
	_ kgo.HookFetchRecordUnbuffered = aheadHook{}
)

// OnFetchRecordBuffered notes r as fetched ahead, until its fetch's lock
// deadline (a record with no deadline is not tracked: nothing to renew
// by).
func (h aheadHook) OnFetchRecordBuffered(r *kgo.Record) {
	dl := acquisitionDeadline(r)
	if dl.IsZero() {
		return
	}
	s := h.ss.src
	s.mu.Lock()
	h.ss.addAhead(r, dl)
	s.mu.Unlock()
}

// OnFetchRecordUnbuffered forgets r when the client dropped it unpolled
// (it releases what it buffered as it leaves the group). A polled record
// stays until take, which reads the lock end its renewals left.
func (h aheadHook) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if polled {
		return
	}
	s := h.ss.src
	s.mu.Lock()
	h.ss.dropAhead(r)
	s.mu.Unlock()
}

// ackRecord marks r's ack with status (kgo.Record.Ack); a variable so that
// tests can watch the acks of records they make, which have no session.
var ackRecord = (*kgo.Record).Ack

// acquisitionDeadline is when r's lock ends as its fetch set it; a
// variable so that tests can give records they make a lock.
var acquisitionDeadline = (*kgo.Record).AcquisitionDeadline

// toRunner converts r with its delivery count; the runner copies the
// bytes it keeps.
func toRunner(r *kgo.Record) runner.Record {
	rec := kgorec.Record(r)
	rec.DeliveryCount = r.DeliveryCount()
	return rec
}
