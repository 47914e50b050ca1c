package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/pkg/runner"
)

// batcher runs a Handler's or QueuedHandler's records in transactions of
// one or more records: the claim, the effects, the COMMIT, a COMMIT in
// doubt, fencing and retries exist once, here, for both.
//
// One record per transaction (Batch 1) is a batch of one, run on the
// handler call's own goroutine with its ctx. With Batch > 1 it is group
// commit per partition. The handler call that finds its partition idle
// leads: it waits up to BatchWait for the batch to fill, takes its own
// record and up to Batch-1 waiting ones, runs them in one transaction,
// hands each waiter its result, and passes the lead to the first record
// that arrived meanwhile (or marks the partition idle). No goroutine is
// started, and a partition has at most one transaction of the batcher open
// at a time.
type batcher struct {
	s  *Store
	fn Effect
	// queued is the QueuedEffect of a QueuedHandler, instead of fn.
	queued QueuedEffect
	// batchFn is the BatchEffect of a BatchHandler, instead of fn: one
	// call for the batch's claimed records, no savepoints.
	batchFn BatchEffect
	// apply runs a batch a leader took and sets each item's err: b.runLed,
	// or a stand-in in the package's tests (which have no database).
	apply func(batch []*item)

	mu    sync.Mutex
	parts map[runner.TP]*pending
}

// pending is one partition's queue. It is in batcher.parts only while a
// leader runs (running) — records can wait only then — and is dropped when
// the partition goes idle, so parts holds the busy partitions, not every
// partition the consumer ever had.
type pending struct {
	tp      runner.TP
	queue   []*item       // waiting, oldest first
	running bool          // a leader is running a batch
	full    chan struct{} // closed when the queue fills a batch, while a leader waits (BatchWait)
}

type itemState uint8

const (
	itemQueued    itemState = iota // in pending.queue
	itemTaken                      // in a running batch
	itemLeading                    // told to lead the next batch
	itemWithdrawn                  // its caller gave up while queued
)

// item is one handler call waiting in a batch.
type item struct {
	ctx    context.Context
	rec    runner.Record
	key    *string
	origin *origin // the record first consumed, for a redriven dead letter
	// originState is what the claim learned of origin.
	originState originState
	state       itemState  // guarded by batcher.mu
	res         chan error // capacity 1: its result, or errLead; nil for Batch 1

	// Set by the leader while it runs the batch.
	err     error
	applied bool
	replay  bool
}

// errLead tells a waiting item to lead the next batch.
var errLead = errors.New("inbox: lead the next batch")

func newBatcher(s *Store, fn Effect) *batcher {
	b := &batcher{s: s, fn: fn, parts: map[runner.TP]*pending{}}
	b.apply = b.runLed
	return b
}

func (b *batcher) handle(ctx context.Context, rec runner.Record) error {
	tp := rec.TP()
	l, ok := b.s.lease(tp)
	switch {
	case b.s.cfg.share && rec.DeliveryCount < 1:
		return fmt.Errorf("%w (record %s)", ErrNotShared, rec.String())
	case !ok && b.s.cfg.share:
		sc, err := b.s.resolve(ctx)
		if err != nil {
			return err
		}
		if l, err = b.s.shareLease(ctx, sc, tp); err != nil {
			return err
		}
	case !ok && rec.DeliveryCount > 0:
		return fmt.Errorf("%w (record %s comes from a share group: make the Store with inbox.ShareGroup() instead)", ErrNoLease, rec.String())
	case !ok:
		return fmt.Errorf("%w (record %s)", ErrNoLease, rec.String())
	}
	// A record whose last COMMIT is in doubt is not claimed again until
	// its outcome is known (the claim would wait on that transaction).
	if done, err := b.s.settled(ctx, &rec); done || err != nil {
		return err
	}
	or, err := originOf(&rec)
	if err != nil {
		return err
	}
	it := &item{ctx: ctx, rec: rec, key: b.s.dedupKey(&rec), origin: or}
	if b.s.cfg.batch <= 1 {
		// Nothing to wait for and no one to answer: the record's batch of
		// one runs here, under its own ctx, at the lease it was given.
		b.run(ctx, []*item{it}, l)
		return it.err
	}
	it.res = make(chan error, 1)
	b.mu.Lock()
	p := b.parts[tp]
	if p == nil {
		p = &pending{tp: tp}
		b.parts[tp] = p
	}
	if !p.running {
		p.running = true
		it.state = itemLeading
		b.mu.Unlock()
		return b.lead(it, p)
	}
	it.state = itemQueued
	p.queue = append(p.queue, it)
	if p.full != nil && len(p.queue) >= b.s.cfg.batch-1 {
		close(p.full)
		p.full = nil
	}
	b.mu.Unlock()

	select {
	case err := <-it.res:
		if err == errLead {
			return b.lead(it, p)
		}
		return err
	case <-ctx.Done():
	}
	b.mu.Lock()
	switch it.state {
	case itemQueued:
		if i := slices.Index(p.queue, it); i >= 0 {
			p.queue = slices.Delete(p.queue, i, i+1)
		}
		it.state = itemWithdrawn
		b.mu.Unlock()
	case itemLeading:
		// The lead came with (or just before) the end of ctx: pass it on,
		// or the partition's waiting records would wait forever.
		<-it.res
		b.handOffLocked(p)
		b.mu.Unlock()
	default:
		// In a running batch: the leader skips it if it has not started,
		// and if its effect commits, its replay finds the inbox row.
		b.mu.Unlock()
	}
	return ctx.Err()
}

// handOffLocked gives the lead to the oldest waiting record, or marks the
// partition idle and forgets it. b.mu must be held.
//
// Forgetting is safe: with no leader and nothing queued no handler call
// holds p any more (a call that gave up while queued took itself out of
// the queue, and one taken into a batch no longer looks at p), and the
// next record of the partition starts a new pending as the first one did.
func (b *batcher) handOffLocked(p *pending) {
	if len(p.queue) == 0 {
		p.running = false
		if b.parts[p.tp] == p {
			delete(b.parts, p.tp)
		}
		return
	}
	next := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	next.state = itemLeading
	next.res <- errLead // capacity 1 and nothing else sent to it yet
}

// lead runs one batch with it first, answers the other records, hands the
// lead on and returns its own result.
//
// The lead is handed on and every record taken into the batch answered even
// when this goroutine unwinds without returning: a panic outside the
// effects (they are recovered in call; a pgx tracer, a meter provider or a
// logger is not) or runtime.Goexit (t.FailNow in an effect: recover does not
// stop it). Otherwise the partition would stay marked running and its
// records would wait forever. The records get errLeaderStopped, so the
// runner's failure policy runs them again. That is safe whatever the batch
// reached: its transaction has ended by then (runOnce's deferred rollback
// ran during the unwind), so it either rolled back — the retry applies
// them — or committed, and the retry is a replay. The panic itself goes on
// to the runner, which makes it the error of the leader's own record.
func (b *batcher) lead(it *item, p *pending) (err error) {
	var batch []*item
	done := false
	defer func() {
		if done {
			return
		}
		for _, q := range batch[min(1, len(batch)):] {
			q.res <- fmt.Errorf("%w: %s, led by %s", errLeaderStopped, q.rec.String(), it.rec.String())
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.handOffLocked(p)
	}()
	b.gather(it, p)
	batch = b.take(it, p)

	b.apply(batch)

	for _, q := range batch[1:] {
		q.res <- q.err
	}
	b.mu.Lock()
	b.handOffLocked(p)
	b.mu.Unlock()
	done = true
	return it.err
}

// errLeaderStopped is the error of the records of a batch whose leader
// unwound before it could answer them (see lead).
var errLeaderStopped = errors.New("inbox: the goroutine leading the batch stopped (panic or runtime.Goexit outside the effects) before the result was known; run the record again")

// gather waits, with BatchWait, for the batch to fill or BatchWait to pass.
func (b *batcher) gather(it *item, p *pending) {
	b.mu.Lock()
	w := b.s.cfg.batchWait
	if w <= 0 || len(p.queue) >= b.s.cfg.batch-1 {
		b.mu.Unlock()
		return
	}
	// The records released by the previous batch come back a moment
	// later, and a batch started at once would hold only the first of
	// them.
	full := make(chan struct{})
	p.full = full
	b.mu.Unlock()
	t := time.NewTimer(w)
	select {
	case <-full:
	case <-t.C:
	case <-it.ctx.Done():
	}
	t.Stop()
	b.mu.Lock()
	if p.full == full {
		p.full = nil
	}
	b.mu.Unlock()
}

// take forms the batch: it, then up to Batch-1 waiting records.
func (b *batcher) take(it *item, p *pending) []*item {
	b.mu.Lock()
	defer b.mu.Unlock()
	it.state = itemTaken
	batch := []*item{it}
	// Two records with the same dedup key never share a batch: the batch
	// claims all its rows in one statement, so the second would be taken
	// for a replay of the first — and reported done — even if the first's
	// effect then rolled back to its savepoint. In separate transactions the
	// second waits for the first's row and claims the key if it rolled back.
	// The same holds for two redrives of one origin (see origin.go), and
	// for a redrive and its origin record itself (redriven is their test).
	// keys stays nil (no allocation) while no record has one.
	var keys map[string]bool
	add := func(ks []string) {
		for _, k := range ks {
			if keys == nil {
				keys = map[string]bool{}
			}
			keys[k] = true
		}
	}
	add(it.keys())
	redrives := it.origin != nil // some record of the batch is a redrive
	rest := p.queue[:0]
	for _, q := range p.queue {
		qk := q.keys()
		dup := false
		for _, k := range qk {
			dup = dup || keys[k]
		}
		if redrives || q.origin != nil {
			for _, x := range batch {
				dup = dup || redriven(q, x) || redriven(x, q)
			}
		}
		if len(batch) == b.s.cfg.batch || dup {
			rest = append(rest, q)
			continue
		}
		redrives = redrives || q.origin != nil
		add(qk)
		q.state = itemTaken
		batch = append(batch, q)
	}
	clear(p.queue[len(rest):])
	p.queue = rest
	return batch
}

// redriven reports whether a is a redrive of the record b.
func redriven(a, b *item) bool {
	o := a.origin
	return o != nil && o.offset == b.rec.Offset && o.partition == b.rec.Partition && o.topic == b.rec.Topic
}

// keys are the identities of it that no other record of its batch may
// share: its dedup key and its origin. Most records have neither.
func (it *item) keys() []string {
	switch {
	case it.key == nil && it.origin == nil:
		return nil
	case it.origin == nil:
		return []string{*it.key}
	case it.key == nil:
		return []string{it.origin.key()}
	}
	return []string{*it.key, it.origin.key()}
}

// runLed runs a batch a leader took, under a context that ends only when
// every record of the batch has given up (batchContext), at the lease the
// Store holds now: the records may have waited through an assignment.
func (b *batcher) runLed(batch []*item) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	l, _ := b.s.lease(batch[0].rec.TP())
	b.run(ctx, batch, l)
}

// run applies a batch under ctx at lease l and sets each item's err. It
// runs the batch's transaction (runOnce or runQueued) again after a
// serialization failure or deadlock, up to Retries times, and after a
// lease taken back (Owners), up to maxRetakes times.
func (b *batcher) run(ctx context.Context, batch []*item, l lease) {
	s := b.s
	tp := batch[0].rec.TP()
	sc, err := s.resolve(ctx)
	for retakes := 0; err == nil; retakes++ {
		err = s.retry(ctx, tp.Topic, func() error {
			for _, it := range batch {
				it.err, it.applied, it.replay = nil, false, false
			}
			switch {
			case b.queued != nil:
				return b.runQueued(ctx, sc, batch, l.epoch)
			case b.batchFn != nil:
				return b.runBatch(ctx, sc, batch, l.epoch)
			}
			return b.runOnce(ctx, sc, batch, l.epoch)
		})
		var fe *FencedError
		if !errors.As(err, &fe) {
			break
		}
		s.countFenced(ctx, tp.Topic) // every refused attempt, also one retaken after
		if retakes == maxRetakes {
			break
		}
		retake := s.retake
		if s.cfg.share {
			retake = s.reread
		}
		epoch, won, rerr := retake(ctx, sc, tp, l, fe.Current)
		if rerr != nil {
			err = rerr
			break
		}
		if !won {
			break
		}
		l.epoch = epoch
		err = nil // run the batch again at the epoch taken back
	}
	if err == nil {
		var applied, replays int64
		for _, it := range batch {
			if it.applied {
				applied++
			}
			if it.replay {
				replays++
			}
		}
		s.countApplied(ctx, tp.Topic, applied)
		s.countReplays(ctx, tp.Topic, replays)
		if s.cfg.batch > 1 || b.batchFn != nil {
			s.countBatch(ctx, tp.Topic, len(batch))
		}
		return
	}
	for _, it := range batch {
		if it.err == nil || it.applied || it.replay {
			// The transaction failed as a whole: nothing of it committed.
			it.err = err
		}
	}
}

// batchContext returns a context for the batch's transaction that ends only
// when every record of the batch has given up (or the batch is done): one
// record's timeout must not abort the others' effects.
func batchContext(batch []*item) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	left := atomic.Int32{}
	left.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, it := range batch {
		stops[i] = context.AfterFunc(it.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// live returns the records of batch whose callers have not given up, in
// order (batch itself when that is all of them); the others get their
// ctx's error.
func live(batch []*item) []*item {
	for i, it := range batch {
		if it.ctx.Err() == nil {
			continue
		}
		l := slices.Clone(batch[:i])
		for _, it := range batch[i:] {
			if err := it.ctx.Err(); err != nil {
				it.err = err
				continue
			}
			l = append(l, it)
		}
		return l
	}
	return batch
}

// claimed are the offsets whose inbox rows a claim inserted.
type claimed []int64

// take reports whether off is one of them and removes it: one row, one
// effect, should an offset ever be in a batch twice. A batch holds at most
// 64 records, so a scan costs less than a map.
func (c *claimed) take(off int64) bool {
	for i, o := range *c {
		if o == off {
			last := len(*c) - 1
			(*c)[i] = (*c)[last]
			*c = (*c)[:last]
			return true
		}
	}
	return false
}

// batchName names a batch in errors and logs: its record when it is a
// batch of one, else its partition.
func batchName(batch []*item) string {
	if len(batch) == 1 {
		return batch[0].rec.String()
	}
	return batch[0].rec.TP().String()
}

// batchSender is what a batch's transaction begins on: the pool (the
// transaction holds a connection until it ends) or an acquired connection.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// claim begins the transaction of batch's records live on conn and, in
// the same round trip, claims their inbox rows at epoch: one statement,
// claim for one record and claimBatch for more. It returns the
// transaction, the offsets whose rows it inserted and the transaction's id
// (for a COMMIT in doubt). tx is never nil, also with an error: the caller
// ends it. A lease at another epoch is a *FencedError; a serialization
// failure or deadlock is returned as it is, to run the transaction again.
func (s *Store) claim(ctx context.Context, conn batchSender, sc *schema, batch, live []*item, epoch int64) (tx pgx.Tx, rows claimed, xid int64, err error) {
	tp := live[0].rec.TP()
	pb := &pgx.Batch{}
	pb.BeginTx(s.cfg.txOptions)
	redrive := slices.ContainsFunc(live, func(it *item) bool { return it.origin != nil })
	var originsIn, originsBelow []int64
	switch {
	case redrive:
		n := len(live)
		offs, keys := make([]int64, n), make([][]byte, n)
		ots, ops, oos := make([]*string, n), make([]*int32, n), make([]*int64, n)
		for i, it := range live {
			offs[i], keys[i] = it.rec.Offset, keyDigest(it.key)
			if o := it.origin; o != nil {
				ots[i], ops[i], oos[i] = &o.topic, &o.partition, &o.offset
			}
		}
		pb.Queue(sc.sql.claimRedrive, s.group, tp.Topic, tp.Partition, offs, keys, epoch, ots, ops, oos)
	case len(live) == 1:
		it := live[0]
		pb.Queue(sc.sql.claim, s.group, tp.Topic, tp.Partition, it.rec.Offset, epoch, keyDigest(it.key))
	default:
		offs := make([]int64, len(live))
		keys := make([][]byte, len(live))
		for i, it := range live {
			offs[i], keys[i] = it.rec.Offset, keyDigest(it.key)
		}
		pb.Queue(sc.sql.claimBatch, s.group, tp.Topic, tp.Partition, offs, keys, epoch)
	}
	br := conn.SendBatch(ctx, pb)
	tx = br.Tx()
	var (
		current *int64
		one     bool
	)
	_, err = br.Exec() // BEGIN
	if err == nil && redrive {
		// Scanned into a variable of this branch: the addresses of
		// originsIn and originsBelow would move them to the heap on every
		// claim, also those without an origin.
		var o struct{ in, below []int64 }
		err = br.QueryRow().Scan(&current, (*[]int64)(&rows), &xid, &o.in, &o.below)
		originsIn, originsBelow = o.in, o.below
	} else if err == nil && len(live) == 1 {
		err = br.QueryRow().Scan(&current, &one, &xid)
		if one {
			rows = claimed{live[0].rec.Offset}
		}
	} else if err == nil {
		err = br.QueryRow().Scan(&current, (*[]int64)(&rows), &xid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil && retryable(err):
		return tx, nil, 0, err
	case err != nil && len(batch) == 1:
		return tx, nil, 0, connError("claiming "+batchName(batch), err)
	case err != nil:
		return tx, nil, 0, connError("claiming the batch of "+batchName(batch), err)
	case current == nil || *current != epoch:
		return tx, nil, 0, &FencedError{Record: batchName(batch), Epoch: epoch, Current: deref(current)}
	}
	for _, it := range live {
		it.originState = originNone
		switch {
		case it.origin == nil || !slices.Contains(rows, it.rec.Offset):
		case slices.Contains(originsIn, it.rec.Offset):
			it.originState = originClaimed
		case slices.Contains(originsBelow, it.rec.Offset):
			it.originState = originBelow
		default:
			it.originState = originApplied
		}
	}
	return tx, rows, xid, nil
}

// originDecided handles a claimed record whose origin the claim found
// applied (a replay) or undecidable (its error); it reports whether it did,
// and then the record's own row must not stand for an applied effect: a
// replay's may (it records the offset as consumed), an undecidable one's
// is for the caller to delete (unclaimArgs) or roll back.
func originDecided(it *item) bool {
	switch it.originState {
	case originApplied:
		it.replay = true
		return true
	case originBelow:
		it.err = &OriginBelowMarkError{Record: it.rec.String(), Origin: it.origin.String()}
		return true
	}
	return false
}

// unclaimArgs are the arguments of the unclaim statement for it: its own
// row and the origin row it claimed, if any.
func (s *Store) unclaimArgs(it *item) []any {
	args := []any{s.group, it.rec.Topic, it.rec.Partition, it.rec.Offset, nil, nil, nil}
	if o := it.origin; o != nil {
		args[4], args[5], args[6] = o.topic, o.partition, o.offset
	}
	return args
}

// runOnce runs the batch's transaction once. It returns an error for the
// batch as a whole (nothing committed); a record whose effect failed has
// its own err and is rolled back to its savepoint, the others go on.
//
// The statements are chosen for the cost that matters once commits are
// shared: statements and round trips per record. One statement claims every
// record's inbox row (in the round trip of BEGIN); then each claimed record
// gets a SAVEPOINT, sent with its effect's first statement (savepointTx),
// and its effect. Savepoints are nested rather than released, which saves a
// RELEASE per record; each record's has a name of its own (Batch's limit of
// 64 bounds the nesting). A failed record is rolled back to its savepoint
// and its inbox row, claimed before the savepoint, deleted.
//
// With Batch 1 the one record's effect gets the transaction itself, no
// savepoint: when it fails, the transaction is rolled back whole.
func (b *batcher) runOnce(ctx context.Context, sc *schema, batch []*item, epoch int64) error {
	s := b.s
	live := live(batch)
	if len(live) == 0 {
		return nil
	}
	tx, rows, xid, err := s.claim(ctx, s.pool, sc, batch, live, epoch)
	// After Commit this is a no-op; on every other path it ends the
	// transaction and gives the connection back (also when fn panics).
	defer tx.Rollback(ctx) //nolint:errcheck
	if err != nil {
		return err
	}
	savepoints := s.cfg.batch > 1
	sp := 0
	for _, it := range live {
		if s.replayed(&rows, it.rec.Offset) {
			it.replay = true
			continue
		}
		if originDecided(it) {
			if it.err == nil {
				continue // a replay of its origin
			}
			if !savepoints {
				return nil // the deferred rollback ends the transaction
			}
			if _, err := tx.Exec(ctx, sc.sql.unclaim, s.unclaimArgs(it)...); err != nil {
				if retryable(err) {
					return err
				}
				return effectError(ctx, "rolling back "+it.rec.String(), err)
			}
			continue
		}
		// A record claimed in this transaction runs even if its caller
		// has given up meanwhile: the effect commits with its row, and
		// the caller's replay finds the row.
		if !savepoints {
			// A batch of one: no other record to keep.
			if ferr := b.call(ctx, tx, it); ferr != nil {
				if retryable(ferr) {
					return ferr
				}
				if tx.Conn().IsClosed() {
					// The effect failed because the connection is gone:
					// the database, not the record (UnavailableError).
					return effectError(ctx, "running the effect of "+it.rec.String(), ferr)
				}
				it.err = fmt.Errorf("inbox: effect of %s: %w", it.rec.String(), ferr)
				return nil // the deferred rollback ends the transaction
			}
			it.applied = true
			continue
		}
		etx := newSavepointTx(ctx, tx, sp)
		sp++
		ferr := b.call(ctx, etx, it)
		if ferr == nil {
			it.applied = true
			continue
		}
		if retryable(ferr) {
			// Under REPEATABLE READ or SERIALIZABLE the transaction's
			// snapshot is spent: only a new transaction can succeed, so
			// the whole batch runs again.
			return ferr
		}
		if tx.Conn().IsClosed() {
			// The effect's failure took the connection, and the batch
			// with it. The failure is this record's, classified as a
			// batch of one's is (effectError: a server shutdown is
			// transient, a transaction timeout is not); the others did
			// nothing wrong and run again without a count.
			it.err = effectError(ctx, "running the effect of "+it.rec.String(), ferr)
			return &UnavailableError{What: "running the batch of " + batchName(batch) + " (the connection ended in the effect of " + it.rec.String() + ")",
				Err: ferr, mark: &runner.TransientError{Err: ferr}}
		}
		var err error
		switch etx.state {
		case spFailed:
			return effectError(ctx, "savepoint for "+it.rec.String(), ferr)
		case spEstablished:
			// Over the simple protocol, in one round trip: if a statement
			// of the effect failed, the transaction is aborted until the
			// rollback, and pgx could not prepare a statement it has not
			// prepared on this connection yet (an aborted transaction
			// refuses Parse too).
			_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+etx.name+"; "+sc.sql.unclaim,
				append([]any{pgx.QueryExecModeSimpleProtocol}, s.unclaimArgs(it)...)...)
		default:
			_, err = tx.Exec(ctx, sc.sql.unclaim, s.unclaimArgs(it)...)
		}
		if err != nil {
			if retryable(err) {
				return err
			}
			return effectError(ctx, "rolling back "+it.rec.String(), err)
		}
		it.err = fmt.Errorf("inbox: effect of %s: %w", it.rec.String(), ferr)
	}
	if err := tx.Commit(ctx); err != nil {
		return b.commitFailed(ctx, sc, batchName(batch), epoch, xid, err, live)
	}
	return nil
}

// commitFailed classifies a failed COMMIT of a batch; live are its
// records, those applied among them count if it committed after all.
func (b *batcher) commitFailed(ctx context.Context, sc *schema, what string, epoch, xid int64, err error, live []*item) error {
	s := b.s
	if isCode(err, belowMarkCode) {
		if len(live) == 1 {
			// The lone record's row was pruned while it claimed it again:
			// a replay (retrying would find it below the mark).
			live[0].applied, live[0].replay = false, true
			return nil
		}
		return err // run the batch again: its claim finds the record below the mark
	}
	if !inDoubt(err) {
		return s.commitError(ctx, what, epoch, err)
	}
	var recs []*runner.Record
	for _, it := range live {
		if it.applied {
			recs = append(recs, &it.rec)
		}
	}
	applied, rerr := s.resolveCommit(ctx, sc, what, xid, err, recs)
	if !applied {
		for _, it := range live {
			it.applied = false
		}
		return rerr
	}
	return nil
}

// call runs fn for one record. With Batch > 1 a panic is recovered here:
// fn runs on the leader's goroutine, so the runner would blame the
// leader's record for it, and the other records of the batch would never
// get an answer. It becomes this record's error and goes to the runner's
// failure policy like any other. A batch of one runs on its record's own
// goroutine: the panic goes on to the runner, which recovers it for that
// record (the deferred rollback in runOnce ends the transaction).
func (b *batcher) call(ctx context.Context, tx pgx.Tx, it *item) (err error) {
	if b.s.cfg.batch <= 1 {
		return b.fn(ctx, tx, it.rec)
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("inbox: effect of %s panicked: %v\n%s", it.rec.String(), v, debug.Stack())
		}
	}()
	return b.fn(ctx, tx, it.rec)
}
