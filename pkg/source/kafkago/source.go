package kafkago

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafka "github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/args"
)

// Source is a runner.Source and runner.DeadLetterWriter over a kafka-go
// ConsumerGroup: one member of one consumer group, with one fetcher per
// assigned partition. Create it with New and hand it to runner.New; the
// runner calls Run, Pause, Resume, Commit and Close. Its methods are safe for
// concurrent use. A Source runs once.
type Source struct {
	cfg     config
	group   string
	topics  []string
	brokers []string
	addr    net.Addr
	log     *slog.Logger
	tr      *kafka.Transport // fetches and offset lookups, for topics only
	client  *kafka.Client    // offset lookups, over tr
	wtr     *kafka.Transport // dead-letter writes, for any topic
	writer  *kafka.Writer
	cgCfg   kafka.ConsumerGroupConfig

	started   atomic.Bool
	closeOnce sync.Once
	closed    chan struct{} // closed by Close

	// mu guards cg and closing, so that Close closes a group Run created.
	mu      sync.Mutex
	cg      *kafka.ConsumerGroup
	closing bool

	// ownMu guards cur, the generation whose partitions the runner was
	// told about, and its active flag.
	ownMu sync.Mutex
	cur   *generation

	// commitSlot is held while a commit request is in flight, including
	// one the runner stopped waiting for: commits reach the coordinator
	// one at a time, in the order the runner sent them, so an older
	// offset never lands after a newer one.
	commitSlot chan struct{}

	// budget is the most records the next hand-over may carry: the
	// runner's last answer. Run sets it before the first generation; then
	// only the current generation's hand-over goroutine uses it.
	budget int

	member *memberView // what Membership reports

	limits atomic.Pointer[runner.FetchLimits] // set by LimitFetch
	shrunk atomic.Bool                        // a fetch size was lowered (logged once)
}

// generation is one kafka-go generation of this member: its partitions and
// their fetchers (both fixed once built).
type generation struct {
	kg       *kafka.Generation
	tps      []runner.TP
	fetchers map[runner.TP]*fetcher
	handover *handover

	// active is true from just before the runner is told of the
	// assignment until the revoke or loss: commits are sent only then.
	// Guarded by Source.ownMu.
	active bool

	// fenced is closed when the coordinator answered a commit in a way
	// that means the member is no longer in this generation (see
	// fencing); fenceErr is that answer.
	fenced    chan struct{}
	fenceOnce sync.Once
	fenceErr  error

	lostReported bool // guarded by Source.ownMu
}

// ErrClosed is returned by Run after Close, and by Commit after Close.
var ErrClosed = errors.New("kafkago: source closed")

// ErrAlreadyRun is returned by Run when the Source already ran.
var ErrAlreadyRun = errors.New("kafkago: Run called more than once")

// ErrNotOwned is matched (with errors.Is) by a *CommitError that left out
// partitions this member does not own in its current generation.
var ErrNotOwned = errors.New("kafkago: partition not owned by this member")

// ErrLost is matched (with errors.Is) by a *CommitError whose commit the
// coordinator refused because the member is no longer in the generation:
// its partitions are lost, reported to the runner as such, and never
// committed again by this generation.
var ErrLost = errors.New("kafkago: partitions lost: the member is no longer in the generation")

// New returns a Source that joins group and consumes topics once Run is
// called. It connects to nothing yet. It returns a *ConfigError naming the
// first invalid argument or option. Close releases the connections.
func New(brokers []string, group string, topics []string, opts ...Option) (*Source, error) {
	if p := args.Check(brokers, group, topics); p != nil {
		return nil, &ConfigError{Option: p.Option, Reason: p.Reason}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:        cfg,
		group:      group,
		topics:     slices.Clone(topics),
		brokers:    slices.Clone(brokers),
		addr:       kafka.TCP(brokers...),
		log:        cfg.logger.With("component", "tidemark.kafkago", "group", group),
		tr:         cfg.transport(topics),
		wtr:        cfg.transport(nil),
		closed:     make(chan struct{}),
		commitSlot: make(chan struct{}, 1),
		budget:     initialBudget,
		member:     newMemberView(),
	}
	s.client = &kafka.Client{Addr: s.addr, Transport: s.tr}
	kgoLog := cfg.logger.With("component", "kafka-go", "group", group)
	s.cgCfg = kafka.ConsumerGroupConfig{
		ID:                    group,
		Brokers:               s.brokers,
		Dialer:                watchedDialer(cfg.dialer, s.member),
		Topics:                s.topics,
		GroupBalancers:        cfg.balancers,
		HeartbeatInterval:     cfg.heartbeatInterval,
		SessionTimeout:        cfg.sessionTimeout,
		RebalanceTimeout:      cfg.rebalanceTimeout,
		JoinGroupBackoff:      cfg.joinGroupBackoff,
		WatchPartitionChanges: true,
		StartOffset:           cfg.startOffset,
		Logger:                kafkaLogger(kgoLog, slog.LevelDebug),
		ErrorLogger:           kafkaLogger(kgoLog, slog.LevelInfo),
	}
	// Validate a copy now, so that Run cannot fail on the configuration.
	check := s.cgCfg
	if err := check.Validate(); err != nil {
		return nil, &ConfigError{Option: "group", Reason: err.Error()}
	}
	s.writer = &kafka.Writer{
		Addr:      s.addr,
		Transport: s.wtr,
		// The Java client's partitioner, so a dead letter lands where a
		// franz-go or Java producer would put its key.
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		// WriteDeadLetter waits for its one record: do not wait for a
		// batch to fill (kafka-go's default waits a second).
		BatchTimeout: 5 * time.Millisecond,
		Logger:       kafkaLogger(kgoLog, slog.LevelDebug),
		ErrorLogger:  kafkaLogger(kgoLog, slog.LevelInfo),
	}
	return s, nil
}

// initialBudget is the budget until Run has asked the runner for its own,
// which it does before any hand-over.
const initialBudget = 1

// smallFetch is the fetch size below which a generation logs that its
// share of memory is thin: below a producer's usual batch (16 KiB for the
// Java client), fetches bring one batch each and cost a round trip per
// batch.
const smallFetch = 16 << 10

func (s *Source) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// GroupError is a group membership error that stopped Run: the broker
// refused the member in a way that needs the operator (authorization, a
// session timeout outside the broker's bounds, or a group whose members
// share no assignment strategy with this one).
type GroupError struct {
	Group string
	Err   error
}

func (e *GroupError) Error() string { return "kafkago: group " + e.Group + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *GroupError) Unwrap() error { return e.Err }

// FetchError is a fetch or offset lookup error that stopped Run: the broker
// refused authentication or authorization.
type FetchError struct {
	TP  runner.TP
	Err error
}

func (e *FetchError) Error() string { return "kafkago: fetch " + e.TP.String() + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *FetchError) Unwrap() error { return e.Err }

// Group returns the consumer group the Source was created for. The runner reads
// it (runner.Grouped) for messaging.consumer.group.name on its spans and
// metrics. It is safe to call at any time.
func (s *Source) Group() string { return s.group }

var _ runner.Grouped = (*Source)(nil)

// Run joins the group and consumes until ctx is done, Close is called, or a
// fatal error (a *GroupError or a *FetchError). Each kafka-go generation
// becomes one assignment: the runner is told of its partitions (starting at
// their committed offsets), a fetcher per partition hands it records, and
// when the generation ends (a rebalance, or the member leaving) the
// fetchers stop and the runner drains and commits every partition before the
// member rejoins. Run blocks while the runner acts on each report. Once the
// runner answers runner.ErrStopped, fetching stops but revokes are still
// reported. Run returns nil when ctx ends or after Close.
func (s *Source) Run(ctx context.Context, sink runner.Sink) error {
	if sink == nil {
		return errors.New("kafkago: Run with a nil sink")
	}
	if !s.started.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	if s.isClosing() {
		return ErrClosed
	}
	// Ask the runner for its budget before the first hand-over too: one
	// of a whole fetch could push a partition past a high water mark below
	// it.
	n, err := sink.Fetched(ctx, nil)
	if err != nil {
		if errors.Is(err, runner.ErrStopped) || ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kafkago: asking the runner for a budget: %w", err)
	}
	s.budget = max(n, 1)

	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrClosed
	}
	// NewConsumerGroup starts joining at once: only now, with the sink
	// known, is the member ready for an assignment.
	cg, err := kafka.NewConsumerGroup(s.cgCfg)
	if err != nil {
		s.mu.Unlock()
		return &GroupError{Group: s.group, Err: err}
	}
	s.cg = cg
	s.mu.Unlock()
	s.log.Info("joining the group", "topics", s.topics)

	for {
		kg, err := cg.Next(ctx)
		if err != nil {
			switch {
			case errors.Is(err, kafka.ErrGroupClosed) || ctx.Err() != nil:
				return nil
			case fatalGroup(err):
				return &GroupError{Group: s.group, Err: err}
			}
			// kafka-go retries by itself (after JoinGroupBackoff unless
			// a rebalance is in progress); UNKNOWN_MEMBER_ID here is the
			// normal way back after the member was removed.
			s.log.Warn("joining the group failed; retrying", "err", err)
			continue
		}
		if err := s.serve(ctx, sink, kg); err != nil {
			return err
		}
	}
}

// serve runs one generation inside kg.Start, so that kafka-go keeps the
// generation's coordinator connection open (and does not rejoin) until its
// partitions are revoked and their final commit was answered.
func (s *Source) serve(ctx context.Context, sink runner.Sink, kg *kafka.Generation) error {
	res := make(chan error, 1)
	kg.Start(func(gctx context.Context) { res <- s.generation(ctx, gctx, sink, kg) })
	return <-res
}

// generation reports one generation's assignment, runs its fetchers, and
// revokes (or loses) its partitions when it ends.
func (s *Source) generation(ctx, gctx context.Context, sink runner.Sink, kg *kafka.Generation) error {
	if gctx.Err() != nil {
		// Ended before it began: kafka-go ran this after the generation
		// closed, and does not wait for it. Touch nothing.
		return nil
	}
	log := s.log.With("generation", kg.ID, "member", kg.MemberID)
	s.member.joined(kg)
	// lctx ends with the generation, with Run, or when this returns.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(gctx, cancel)()

	var tps []runner.TP
	starts := map[runner.TP]int64{}
	for topic, parts := range kg.Assignments {
		for _, p := range parts {
			tp := runner.TP{Topic: topic, Partition: int32(p.ID)}
			tps = append(tps, tp)
			starts[tp] = p.Offset
		}
	}
	sortTPs(tps)
	if len(tps) == 0 {
		// More members than partitions: the runner still hears that
		// the member joined (readiness counts an empty assignment).
		log.Info("joined the group with no partitions")
		if err := sink.Assigned(lctx, nil); err != nil && !errors.Is(err, runner.ErrStopped) && lctx.Err() == nil {
			log.Warn("runner did not take the empty assignment", "err", err)
		}
		<-lctx.Done()
		return nil
	}
	if err := s.resolve(lctx, starts); err != nil {
		if lctx.Err() != nil {
			return nil
		}
		return err
	}

	g := &generation{kg: kg, tps: tps, fetchers: make(map[runner.TP]*fetcher, len(tps)), fenced: make(chan struct{}),
		handover: newHandover(s, sink)}
	size := s.fetchSizeFor(len(tps))
	if size.bytes < smallFetch && int(size.bytes) < s.cfg.maxBytes {
		log.Warn("fetches are small for this many partitions: raise runner.MaxBufferedBytes (the adapter's share is divided among the partitions); a fetch still brings one whole batch, so batches larger than the fetch size exceed the memory bound",
			"partitions", len(tps), "fetch_bytes", size.bytes)
	}
	as := make([]runner.Assignment, len(tps))
	for i, tp := range tps {
		g.fetchers[tp] = newFetcher(s, g.handover, tp, starts[tp], size)
		as[i] = runner.Assignment{TP: tp, Start: starts[tp], Generation: kg.ID, Member: kg.MemberID}
	}
	s.ownMu.Lock()
	s.cur, g.active = g, true
	s.ownMu.Unlock()
	log.Info("partitions assigned", "partitions", tpStrings(tps), "fetch_bytes", size.bytes)

	// The runner starts every assignment with fresh epochs, even when
	// kafka-go hands back the same generation id and partitions (a member
	// that rejoins a stable group gets the current generation again).
	var wg sync.WaitGroup
	fatal := make(chan error, len(tps))
	fctx, stopFetchers := context.WithCancel(lctx)
	defer stopFetchers()
	// lctx, not ctx: an assign hook still retrying (a database outage)
	// when the generation ends gives up, instead of taking a lease for an
	// assignment that is over. Nothing is assigned then.
	switch err := sink.Assigned(lctx, as); {
	case err == nil:
		wg.Go(func() { g.handover.run(fctx) })
		for _, tp := range tps {
			f := g.fetchers[tp]
			wg.Go(func() {
				if err := f.run(fctx); err != nil {
					fatal <- err
				}
			})
		}
	case errors.Is(err, runner.ErrStopped):
		log.Debug("runner stopping; not fetching")
	default:
		// Run's ctx or the generation ended: nothing was assigned.
		s.deactivate(g)
		return nil
	}

	var fatalErr error
	select {
	case <-lctx.Done():
	case <-g.fenced:
	case fatalErr = <-fatal:
	}
	// Stop fetching before the revoke, and wait: nothing fetched under
	// this generation may reach the runner after it (or under the next).
	stopFetchers()
	wg.Wait()

	select {
	case <-g.fenced:
		s.lose(ctx, sink, g, log)
	default:
		s.revoke(ctx, sink, g, log)
	}
	if fatalErr != nil {
		log.Error("fatal fetch error; stopping", "err", fatalErr)
	}
	return fatalErr
}

// revoke asks the runner to drain and commit the generation's partitions.
// kafka-go does not heartbeat meanwhile, so the drain gets a deadline
// safely below the session and rebalance timeouts (see RebalanceTimeout).
// If the coordinator refuses a commit during the drain because the member
// is gone, the partitions are reported lost at once, so the runner stops
// waiting for their handlers and cancels them.
func (s *Source) revoke(ctx context.Context, sink runner.Sink, g *generation, log *slog.Logger) {
	deadline := time.Now().Add(s.cfg.drainTimeout())
	log.Info("generation ended; draining and committing", "partitions", tpStrings(g.tps), "deadline", deadline)
	done := make(chan error, 1)
	go func() { done <- sink.Revoked(ctx, g.tps, deadline) }()
	var err error
	select {
	case err = <-done:
	case <-g.fenced:
		s.lose(ctx, sink, g, log)
		err = <-done
	}
	if !benign(ctx, err) {
		log.Warn("revoke drain ended with an error", "err", err)
	}
	s.deactivate(g)
	select {
	case <-g.fenced:
		// The final commit was refused: the member had been removed
		// while it drained. The runner already ended the partitions;
		// report them lost all the same (a no-op for it if so).
		s.lose(ctx, sink, g, log)
	default:
	}
}

// lose reports the generation's partitions lost, once.
func (s *Source) lose(ctx context.Context, sink runner.Sink, g *generation, log *slog.Logger) {
	s.ownMu.Lock()
	first, why := !g.lostReported, g.fenceErr
	g.lostReported = true
	g.active = false
	s.ownMu.Unlock()
	if !first {
		return
	}
	log.Warn("partitions lost: the member is no longer in the generation; nothing more is committed for them", "partitions", tpStrings(g.tps), "err", why)
	if err := sink.Lost(ctx, g.tps); !benign(ctx, err) {
		log.Warn("runner did not take the loss", "err", err)
	}
}

// deactivate stops commits for g.
func (s *Source) deactivate(g *generation) {
	s.ownMu.Lock()
	g.active = false
	s.ownMu.Unlock()
}

// fence records that the coordinator refused a commit of g because the
// member is no longer in the generation.
func (s *Source) fence(g *generation, err error) {
	g.fenceOnce.Do(func() {
		s.ownMu.Lock()
		g.active = false
		g.fenceErr = err
		s.ownMu.Unlock()
		close(g.fenced)
	})
}

// resolve turns the start offsets kafka-go could not know (a partition with
// no committed offset gets StartOffset: kafka.FirstOffset or LastOffset)
// into offsets, retrying until ctx ends or a fatal error.
func (s *Source) resolve(ctx context.Context, starts map[runner.TP]int64) error {
	for tp, off := range starts {
		if off >= 0 {
			continue
		}
		for attempt := 1; ; attempt++ {
			got, err := s.listOffset(ctx, tp, off)
			if err == nil {
				starts[tp] = got
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if fatalFetch(err) {
				return &FetchError{TP: tp, Err: err}
			}
			s.log.Warn("looking up the start offset failed; retrying", "partition", tp.String(), "attempt", attempt, "err", err)
			sleep(ctx, retryWait(attempt))
		}
	}
	return nil
}

// listOffset returns tp's first offset or last stable offset (which is
// kafka.FirstOffset or kafka.LastOffset).
func (s *Source) listOffset(ctx context.Context, tp runner.TP, which int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := s.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{tp.Topic: {{Partition: int(tp.Partition), Timestamp: which}}},
		IsolationLevel: kafka.ReadCommitted,
	})
	if err != nil {
		return 0, err
	}
	for _, p := range resp.Topics[tp.Topic] {
		if p.Partition != int(tp.Partition) {
			continue
		}
		if p.Error != nil {
			return 0, p.Error
		}
		if which == kafka.FirstOffset {
			return p.FirstOffset, nil
		}
		return p.LastOffset, nil
	}
	return 0, fmt.Errorf("kafkago: no offset listed for %s", tp)
}

// fatalGroup reports whether an error joining the group cannot go away
// without the operator.
func fatalGroup(err error) bool {
	for _, e := range []error{
		kafka.InvalidSessionTimeout,
		kafka.InconsistentGroupProtocol,
		kafka.GroupAuthorizationFailed,
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

// benign reports whether a Sink call's err is nil or says the runner (or
// Run's ctx) has stopped.
func benign(ctx context.Context, err error) bool {
	return err == nil || errors.Is(err, runner.ErrStopped) || ctx.Err() != nil
}

// Pause stops handing tps to the runner and fetching them once their
// fetchers' current fetch is in: what a fetcher holds is kept, not fetched
// again. It does not block; its cost is in the number of partitions given,
// not assigned.
func (s *Source) Pause(tps []runner.TP) { s.setPaused(tps, true) }

// Resume lets tps be handed to the runner and fetched again, starting with
// what their fetchers kept. It does not block.
func (s *Source) Resume(tps []runner.TP) { s.setPaused(tps, false) }

func (s *Source) setPaused(tps []runner.TP, paused bool) {
	s.ownMu.Lock()
	g := s.cur
	s.ownMu.Unlock()
	if g == nil {
		return
	}
	fs := make([]*fetcher, 0, len(tps))
	for _, tp := range tps {
		if f := g.fetchers[tp]; f != nil {
			fs = append(fs, f)
		}
	}
	g.handover.setPaused(fs, paused)
}

// CommitError reports a commit that was not acknowledged for every
// partition. kafka-go answers a commit with one error for the whole
// request, so Err applies to every partition in Failed.
type CommitError struct {
	// Generation and MemberID name the generation the commit was sent
	// with; zero and empty when none was current.
	Generation int32
	MemberID   string
	// Failed lists the partitions sent whose outcome is failed or unknown.
	Failed []runner.TP
	// Err is the coordinator's answer (a kafka.Error) or the request's
	// error; nil when nothing was sent.
	Err error
	// NotOwned lists the partitions left out because the current
	// generation does not own them (revoked or lost before the commit).
	NotOwned []runner.TP
}

func (e *CommitError) Error() string {
	var b strings.Builder
	b.WriteString("kafkago: commit")
	if len(e.Failed) > 0 {
		fmt.Fprintf(&b, " in generation %d failed for %s: %v", e.Generation, strings.Join(tpStrings(e.Failed), ", "), e.Err)
		if fencing(e.Err) {
			b.WriteString(" (partitions lost)")
		}
	}
	if len(e.NotOwned) > 0 {
		if len(e.Failed) > 0 {
			b.WriteByte(';')
		}
		b.WriteString(" not sent for partitions not owned: " + strings.Join(tpStrings(e.NotOwned), ", "))
	}
	return b.String()
}

// Unwrap returns Err, ErrLost when Err means the member is no longer in the
// generation, and ErrNotOwned when NotOwned is not empty.
func (e *CommitError) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
		if fencing(e.Err) {
			errs = append(errs, ErrLost)
		}
	}
	if len(e.NotOwned) > 0 {
		errs = append(errs, ErrNotOwned)
	}
	return errs
}

// fencing reports whether the coordinator's answer to a commit means the
// member is no longer in the generation it committed with. In the classic
// protocol the coordinator checks only the member id and generation, never
// who owns the partition. ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID say the
// member was removed (session expired, or evicted) or the group moved on.
// REBALANCE_IN_PROGRESS answers a commit while the group waits for
// SyncGroup; brokers before the Kafka 3.x group coordinator rewrite sent it
// even to removed members, and a generation handed out by kafka-go is never
// in that state, so it is treated as a loss too: at worst its records run
// again, which at-least-once allows.
func fencing(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.RebalanceInProgress)
}

// Commit commits offsets (the next offset to consume per partition) with
// the current generation's member id and generation id through kafka-go's
// Generation.CommitOffsets, and returns when the coordinator answered or ctx
// is done. Offsets of partitions the current generation does not own are
// not sent. Commits are sent one at a time: one that ctx gave up on still
// holds back the next until the coordinator answers it (kafka-go bounds the
// request by its 5s coordinator timeout). It returns nil when every offset
// was acknowledged and a *CommitError otherwise. An answer meaning the
// member is no longer in the generation (see ErrLost) also ends the
// generation: its partitions are reported lost to the runner, and the
// member rejoins.
func (s *Source) Commit(ctx context.Context, offsets []runner.Offset) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	select {
	case <-s.closed:
		return ErrClosed
	case s.commitSlot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("kafkago: commit: waiting for the previous commit: %w", ctx.Err())
	}
	sending := false
	defer func() {
		if !sending {
			<-s.commitSlot
		}
	}()

	s.ownMu.Lock()
	g := s.cur
	if g != nil && !g.active {
		g = nil
	}
	s.ownMu.Unlock()

	ce := &CommitError{}
	send := map[string]map[int]int64{}
	for _, o := range offsets {
		if g == nil || g.fetchers[o.TP] == nil {
			ce.NotOwned = append(ce.NotOwned, o.TP)
			continue
		}
		ps := send[o.TP.Topic]
		if ps == nil {
			ps = map[int]int64{}
			send[o.TP.Topic] = ps
		}
		ps[int(o.TP.Partition)] = o.Offset
		ce.Failed = append(ce.Failed, o.TP)
	}
	sortTPs(ce.NotOwned)
	sortTPs(ce.Failed)
	if len(ce.NotOwned) > 0 {
		s.log.Warn("not committing offsets for partitions this member does not own", "partitions", tpStrings(ce.NotOwned))
	}
	if len(send) == 0 {
		ce.Failed = nil
		if len(ce.NotOwned) > 0 {
			return ce
		}
		return nil
	}
	ce.Generation, ce.MemberID = g.kg.ID, g.kg.MemberID

	// kafka-go's CommitOffsets takes no ctx: run it aside and stop
	// waiting when ctx ends. The goroutine keeps the commit slot until the
	// coordinator answered (or kafka-go's timeout), and Close waits for it.
	sending = true
	res := make(chan error, 1)
	go func() {
		defer func() { <-s.commitSlot }()
		err := g.kg.CommitOffsets(send)
		if fencing(err) {
			s.log.Warn("commit refused: the member is no longer in the generation", "generation", g.kg.ID, "member", g.kg.MemberID, "err", err)
			s.fence(g, err)
		}
		res <- err
	}()
	var err error
	select {
	case err = <-res:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		if len(ce.NotOwned) > 0 {
			ce.Failed = nil
			return ce
		}
		return nil
	}
	ce.Err = err
	return ce
}

// WriteDeadLetter produces rec's key, value and headers to topic and returns
// once every in-sync replica has it (RequiredAcks all) or with the error;
// ctx bounds the wait. kafka-go's writer is not idempotent: a retried write
// can store the record twice. The topic must exist unless the broker
// creates topics on demand. It is safe to call concurrently.
func (s *Source) WriteDeadLetter(ctx context.Context, topic string, rec runner.Record) error {
	m := kafka.Message{Topic: topic, Key: rec.Key, Value: rec.Value}
	if len(rec.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	if err := s.writer.WriteMessages(ctx, m); err != nil {
		if refused(err) {
			err = &runner.RefusedError{Err: err}
		}
		return fmt.Errorf("kafkago: dead-letter write of %s to %q: %w", rec.String(), topic, err)
	}
	return nil
}

// refused reports whether err is a write error that the same message
// meets on every retry: too large (the broker's, the topic's
// max.message.bytes, or the Writer's own BatchBytes check, a
// MessageTooLargeError) or invalid. kafka-go returns a WriteErrors, one
// per message, from a synchronous write.
func refused(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && refused(e) {
				return true
			}
		}
		return false
	}
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge) ||
		errors.Is(err, kafka.InvalidRecord) || errors.Is(err, kafka.InvalidMessage)
}

// Close leaves the group and releases the connections: it waits for a
// commit still in flight, then closes the kafka-go ConsumerGroup, which ends
// the current generation (its revoke reaches a stopped runner and returns at
// once) and sends LeaveGroup, so the partitions move to the other members
// without waiting for the session timeout. The runner calls it after its
// final commit. Close is safe to call more than once; later calls return at
// once. Run returns after Close; Commit returns ErrClosed.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		cg := s.cg
		s.mu.Unlock()
		close(s.closed)
		// Wait for a commit in flight: leaving first would cut it off.
		s.commitSlot <- struct{}{}
		<-s.commitSlot
		if cg != nil {
			cg.Close()
		}
		s.writer.Close()
		s.wtr.CloseIdleConnections()
		s.tr.CloseIdleConnections()
		s.log.Info("left the group and closed the connections")
	})
	return nil
}

func sortTPs(tps []runner.TP) {
	slices.SortFunc(tps, func(a, b runner.TP) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
}

func tpStrings(tps []runner.TP) []string {
	out := make([]string, len(tps))
	for i, tp := range tps {
		out[i] = tp.String()
	}
	return out
}
