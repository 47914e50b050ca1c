package share

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/kgorec"
)

// Source is a runner.Source and runner.Settler over a share group. Create
// it with New and give it to runner.New; the runner is its only caller.
// Run, Close and the Sink-facing methods follow runner.Source's contract.
type Source struct {
	cfg    config
	group  string
	topics []string
	log    *slog.Logger
	tel    *telemetry

	sessions []*session

	// mu guards everything below. It is held only for map and slice
	// updates and for Record.Ack, which does no I/O (franz-go queues the
	// ack and wakes its fetch loop); never across a Sink call or a
	// request.
	mu sync.Mutex
	// held maps every record in the runner to its copies: the first is the
	// one handed over; later ones are deliveries of the same offset to a
	// session while the first still ran (its lock had been lost), which
	// the source keeps and settles as the first is settled, so the runner
	// never holds one offset twice (runner.Settler).
	held   map[recKey]*heldRec
	paused map[runner.TP]struct{} // by the runner's flow control
	stop   context.CancelFunc     // cancels the sessions (set by Run)
	closed bool

	// assignMu serializes the reports of new partitions (Sink.Assigned),
	// so each partition is reported once.
	assignMu sync.Mutex
	reported map[runner.TP]bool

	joins *joins // when every session was answered (Membership)

	// handMu serializes the sessions' hand-overs (Sink.Fetched), so that
	// each hands over no more than the runner's last answer allows:
	// budget, the records the next hand-over may carry, is one for the
	// whole source.
	handMu sync.Mutex
	budget int

	runDone chan struct{} // closed when Run's sessions have returned
	started bool          // under mu
}

type recKey struct {
	tp  runner.TP
	off int64
}

type heldRec struct {
	copies []heldCopy
}

type heldCopy struct {
	s   *session
	rec *kgo.Record
}

// New returns a Source that joins share group group on brokers and
// consumes topics. It creates one franz-go client per session; they join
// the group only when Run starts. It returns a *ConfigError for invalid
// arguments or options.
func New(brokers []string, group string, topics []string, opts ...Option) (*Source, error) {
	switch {
	case len(brokers) == 0:
		return nil, &ConfigError{Option: "brokers", Reason: "no seed broker"}
	case group == "":
		return nil, &ConfigError{Option: "group", Reason: "empty group"}
	case len(topics) == 0:
		return nil, &ConfigError{Option: "topics", Reason: "no topic"}
	}
	for i, t := range topics {
		if t == "" {
			return nil, &ConfigError{Option: "topics", Reason: fmt.Sprintf("topic %d is empty", i)}
		}
		if slices.Contains(topics[:i], t) {
			return nil, &ConfigError{Option: "topics", Reason: fmt.Sprintf("topic %q given twice", t)}
		}
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newTelemetry(cfg.meterProvider, group)
	if err != nil {
		return nil, fmt.Errorf("share: creating the source's metric: %w", err)
	}
	s := &Source{
		tel:      tel,
		cfg:      cfg,
		group:    group,
		topics:   slices.Clone(topics),
		log:      cfg.logger.With("component", "tidemark.share", "group", group),
		held:     map[recKey]*heldRec{},
		paused:   map[runner.TP]struct{}{},
		reported: map[runner.TP]bool{},
		runDone:  make(chan struct{}),
		joins:    newJoins(cfg.sessions),
	}
	for i := range cfg.sessions {
		ss := &session{src: s, id: i, held: map[recKey]*lockedRec{}, ahead: map[*kgo.Record]*lockedRec{}, aheadAt: map[recKey]int{}, refused: map[runner.TP]bool{}, wake: make(chan struct{}, 1), contact: contactOf(s.joins, i), flight: &fetchFlight{}}
		kopts := append([]kgo.Opt{
			kgo.WithLogger(kgoLogger{cfg.logger.With("component", "franz-go", "group", group, "session", i)}),
			// A share fetch in flight holds the session's acks, its
			// renewals too, until it returns: one that slipped out as a
			// poll returned waits for records up to FetchMaxWait. A
			// second, not franz-go's 5 s, keeps that well under a lock;
			// ClientOptions may set another.
			kgo.FetchMaxWait(defaultFetchMaxWait),
		}, cfg.clientOpts...)
		kopts = append(kopts,
			kgo.SeedBrokers(brokers...),
			kgo.ShareGroup(group),
			// No topics yet: Run subscribes, so the session joins only
			// once it can report to the runner.
			kgo.ConsumeTopics(),
			// The broker acquires at most this many records per fetch,
			// and the client fetches only while a poll runs: nothing is
			// acquired (its lock running) long before it is handed over.
			kgo.ShareMaxRecords(int32(cfg.maxPollRecords)),
			kgo.ShareMaxRecordsStrict(),
			kgo.ShareAckCallback(ss.onAcks),
			kgo.WithHooks(ss.contact, aheadHook{ss}, ss.flight),
		)
		// The coordinator's answers are read off the wire: kgo's hooks
		// do not say whether a heartbeat was refused (Membership).
		wire, err := ss.contact.WireOptions(append(slices.Clone(cfg.clientOpts), kgo.SeedBrokers(brokers...)))
		if err != nil {
			s.closeClients()
			return nil, fmt.Errorf("share: creating the client of session %d: %w", i, err)
		}
		cl, err := kgo.NewClient(append(kopts, wire...)...)
		if err != nil {
			s.closeClients()
			return nil, fmt.Errorf("share: creating the client of session %d: %w", i, err)
		}
		if n, _ := cl.OptValue(kgo.MaxConcurrentFetches).(int); n != 0 {
			cl.Close()
			s.closeClients()
			return nil, &ConfigError{Option: "ClientOptions", Reason: fmt.Sprintf("kgo.MaxConcurrentFetches(%d): a share session must fetch only while it polls (0), or records would be acquired and their locks run before they are handed over", n)}
		}
		ss.cl = cl
		ss.idle, _ = cl.OptValue(kgo.ConnIdleTimeout).(time.Duration)
		ss.maxWait, _ = cl.OptValue(kgo.FetchMaxWait).(time.Duration)
		s.sessions = append(s.sessions, ss)
	}
	return s, nil
}

func (s *Source) closeClients() {
	for _, ss := range s.sessions {
		ss.cl.Close()
	}
}

// defaultFetchMaxWait is the share sessions' FetchMaxWait unless
// ClientOptions sets one.
const defaultFetchMaxWait = time.Second

// Group returns the share group the Source was created for. The runner reads
// it (runner.Grouped) for messaging.consumer.group.name on its spans and
// metrics. It is safe to call at any time.
func (s *Source) Group() string { return s.group }

var _ runner.Grouped = (*Source)(nil)

// Run applies the GroupConfig settings (with share.isolation.level set to
// read_committed unless the group or a GroupConfig sets it), subscribes
// every session and runs them until ctx is done or Close; it returns nil
// then, or the error that stopped it (a group config the broker refused or
// did not let it read).
func (s *Source) Run(ctx context.Context, sink runner.Sink) error {
	s.mu.Lock()
	if s.started || s.closed {
		s.mu.Unlock()
		return runner.ErrStopped
	}
	s.started = true
	ctx, cancel := context.WithCancel(ctx)
	s.stop = cancel
	s.mu.Unlock()
	defer close(s.runDone)
	defer cancel()

	kvs, err := s.withIsolation(ctx, s.sessions[0].cl)
	if err != nil {
		return err
	}
	if len(kvs) > 0 {
		if err := alterGroupConfigs(ctx, s.sessions[0].cl, s.group, kvs); err != nil {
			return err
		}
	}
	// The join report ends with the sessions, whichever way they end.
	jctx, jcancel := context.WithCancel(ctx)
	var jwg sync.WaitGroup
	jwg.Go(func() { s.reportJoined(jctx, sink) })
	defer jwg.Wait()
	defer jcancel()
	var wg sync.WaitGroup
	for _, ss := range s.sessions {
		ss.cl.AddConsumeTopics(s.topics...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss.run(ctx, sink)
		}()
	}
	wg.Wait()
	return nil
}

// isolationConfig is the share group's isolation level config.
const isolationConfig = "share.isolation.level"

// withIsolation returns the GroupConfig settings Run applies, with
// share.isolation.level=read_committed added when the group reads
// uncommitted records by default: a share group's default is
// read_uncommitted, and the group sources read committed records only.
// A GroupConfig of the user's for it wins, and so does one an operator
// set on the group (logged).
func (s *Source) withIsolation(ctx context.Context, cl *kgo.Client) ([][2]string, error) {
	kvs := s.cfg.groupConfigs
	for _, kv := range kvs {
		if kv[0] == isolationConfig {
			return kvs, nil
		}
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = s.group
	res.ConfigNames = []string{isolationConfig}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("share: reading the configs of group %q (its share.isolation.level; GroupConfig(%q, ...) sets it unread): %w", s.group, isolationConfig, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return nil, fmt.Errorf("share: reading the configs of group %q (its share.isolation.level; GroupConfig(%q, ...) sets it unread): %w%s", s.group, isolationConfig, err, msg)
		}
		for _, c := range r.Configs {
			if c.Name != isolationConfig || c.Value == nil {
				continue
			}
			switch {
			case *c.Value == "read_committed":
				return kvs, nil
			case c.Source == kmsg.ConfigSourceGroupConfig:
				s.log.Warn("the share group reads uncommitted records: share.isolation.level is set on the group", "group", s.group, "value", *c.Value)
				return kvs, nil
			}
		}
	}
	return append(slices.Clone(kvs), [2]string{isolationConfig, "read_committed"}), nil
}

// handOver hands the runner as many of batches as its budget allows and
// returns the rest; with no batches it only reads the budget. While a
// partition is paused it hands over nothing: the runner's budget leaves
// paused partitions out (a group source fetches nothing of them until they
// resume), and a share fetch brings any partition's records. On an error
// the runner took none of them.
func (s *Source) handOver(ctx context.Context, sink runner.Sink, batches []runner.Batch) ([]runner.Batch, error) {
	s.handMu.Lock()
	defer s.handMu.Unlock()
	var now, rest []runner.Batch
	if len(batches) > 0 {
		s.mu.Lock()
		paused := len(s.paused) > 0
		s.mu.Unlock()
		if paused {
			return batches, nil
		}
		now, rest = splitBatches(batches, s.budget)
	}
	budget, err := sink.Fetched(ctx, now)
	if err != nil {
		return batches, err
	}
	s.budget = budget
	return rest, nil
}

// alterGroupConfigs sets configs on the share group's GROUP resource.
func alterGroupConfigs(ctx context.Context, cl *kgo.Client, group string, kvs [][2]string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for _, kv := range kvs {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name = kv[0]
		v := kv[1]
		c.Value = &v
		c.Op = kmsg.IncrementalAlterConfigOpSet
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("share: setting the configs of group %q: %w", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return fmt.Errorf("share: setting the configs of group %q: %w%s", group, err, msg)
		}
	}
	return nil
}

// Settle acks the record at tp/offset, and every other copy the source
// holds of it, with the runner's outcome: Accepted → AckAccept, Rejected →
// AckReject, Released → AckRelease. It is called from the runner's poll
// goroutine and does not block: franz-go queues the acks and sends them
// within about a second, with the session's next fetch, or at Close.
func (s *Source) Settle(tp runner.TP, offset int64, st runner.Settlement) {
	status := kgo.AckRelease
	switch st {
	case runner.Accepted:
		status = kgo.AckAccept
	case runner.Rejected:
		status = kgo.AckReject
	}
	k := recKey{tp, offset}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[k]
	if h == nil {
		s.log.Error("settled a record the source does not hold", "record", tp.String()+"@"+strconv.FormatInt(offset, 10), "settlement", st.String())
		return
	}
	delete(s.held, k)
	now := time.Now()
	for _, c := range h.copies {
		// The ack (or its queueing) before the session may see itself
		// settled: its next poll would accept a record left without a
		// terminal ack, and it sends its queued acks before it polls.
		c.s.ack(k, c.rec, status, now)
		delete(c.s.held, k)
		// Every settlement: a session handing a poll over in parts
		// waits for room in the budget.
		c.s.signal()
	}
}

// Pause and Resume record the runner's flow control. A share fetch cannot
// leave partitions out without acquiring and then releasing their records
// (raising their delivery counts), so a session does not poll at all while
// any partition is paused.
func (s *Source) Pause(tps []runner.TP) {
	s.mu.Lock()
	for _, tp := range tps {
		s.paused[tp] = struct{}{}
	}
	s.mu.Unlock()
}

// Resume: see Pause.
func (s *Source) Resume(tps []runner.TP) {
	s.mu.Lock()
	for _, tp := range tps {
		delete(s.paused, tp)
	}
	wake := len(s.paused) == 0
	s.mu.Unlock()
	if wake {
		for _, ss := range s.sessions {
			ss.signal()
		}
	}
}

// errNoCommit is what Commit returns: the runner never commits over a
// runner.Settler, so a call is a bug.
var errNoCommit = errors.New("share: a share group has no offsets to commit")

// Commit returns an error: a share source settles records one by one and
// the runner never calls Commit over it.
func (s *Source) Commit(context.Context, []runner.Offset) error { return errNoCommit }

// LimitFetch sizes every session's fetches so that what the sessions hold
// stays within l.Bytes: each gets FetchMaxBytes = l.Bytes / (2 × Sessions)
// (a fetch being handed over, and the one a poll may have started before it
// returned) and FetchMaxPartitionBytes = min(that, l.PartitionBytes /
// l.MaxCompression). It fails when that leaves a fetch under 1 KiB.
func (s *Source) LimitFetch(l runner.FetchLimits) error {
	per := l.Bytes / int64(2*len(s.sessions))
	if per < 1<<10 {
		return fmt.Errorf("share: %d bytes for %d sessions leave each fetch %d bytes, under 1 KiB (raise MaxBufferedBytes or lower Sessions)", l.Bytes, len(s.sessions), per)
	}
	per = min(per, 50<<20)
	part := min(per, int64(float64(l.PartitionBytes)/max(l.MaxCompression, 1)))
	for _, ss := range s.sessions {
		ss.cl.UpdateFetchMaxBytes(int32(per), int32(max(part, 1<<10)))
	}
	return nil
}

// WriteDeadLetter produces rec's key, value and headers to topic through
// the first session's client and returns once the broker acknowledged the
// write, or with the produce error; ctx bounds the wait. It is safe to call
// concurrently.
func (s *Source) WriteDeadLetter(ctx context.Context, topic string, rec runner.Record) error {
	return kgorec.WriteDeadLetter(ctx, s.sessions[0].cl, "share", topic, rec)
}

// Close stops the sessions, releases every record still held (the runner
// has stopped: whatever it did not settle did not finish here), flushes
// the acks and leaves the group, within CloseTimeout. It returns the first
// error of the flush or the leave; it is safe to call more than once.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started, stop := s.started, s.stop
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.closeTimeout)
	defer cancel()
	if started {
		stop()
		<-s.runDone
		s.awaitFetches(ctx)
	}
	s.mu.Lock()
	n := 0
	now := time.Now()
	for k, h := range s.held {
		for _, c := range h.copies {
			// Through the session's queues: an expired lock's release
			// goes alone, after the others.
			c.s.ack(k, c.rec, kgo.AckRelease, now)
			delete(c.s.held, k)
			n++
		}
		delete(s.held, k)
	}
	for _, ss := range s.sessions {
		// Acks a stopped session had deferred are marked now, before
		// the flush; the stale ones after it.
		ss.markDeferred()
		ss.isolating = false
	}
	s.mu.Unlock()
	if n > 0 {
		s.log.Info("released the records still held", "records", n)
	}
	var errs []error
	var wg sync.WaitGroup
	errc := make([]error, len(s.sessions))
	for i, ss := range s.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss.sendStale(ctx)
			if err := ss.cl.FlushAcks(ctx); err != nil {
				errc[i] = fmt.Errorf("share: session %d: flushing acks: %w", i, err)
			}
			if err := ss.cl.LeaveGroupContext(ctx); err != nil && errc[i] == nil {
				errc[i] = fmt.Errorf("share: session %d: leaving the group: %w", i, err)
			}
			ss.cl.Close()
		}()
	}
	wg.Wait()
	for _, err := range errc {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// awaitFetches waits until no session has a share fetch on the wire, at
// most the longest a fetch waits at the broker and a second (or until ctx
// ends). The sessions have stopped polling, but a fetch of theirs may still
// wait at the broker for records: one released now would be acquired by
// it, with no handler to run it, and released again as its session leaves
// — a delivery counted toward share.delivery.count.limit for nothing.
func (s *Source) awaitFetches(ctx context.Context) {
	var longest time.Duration
	for _, ss := range s.sessions {
		longest = max(longest, ss.maxWait)
	}
	ctx, cancel := context.WithTimeout(ctx, longest+time.Second)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		busy := 0
		for _, ss := range s.sessions {
			if ss.flight.n.Load() > 0 {
				busy++
			}
		}
		if busy == 0 {
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			s.log.Debug("releasing the records still held with fetches in flight", "sessions", busy)
			return
		}
	}
}

// report tells the runner about partitions it has not seen yet, once each.
func (s *Source) report(ctx context.Context, sink runner.Sink, tps []runner.TP) error {
	s.assignMu.Lock()
	defer s.assignMu.Unlock()
	var as []runner.Assignment
	for _, tp := range tps {
		if !s.reported[tp] {
			as = append(as, runner.Assignment{TP: tp, Start: -1, Generation: runner.NoGeneration})
		}
	}
	if len(as) == 0 {
		return nil
	}
	if err := sink.Assigned(ctx, as); err != nil {
		return err
	}
	for _, a := range as {
		s.reported[a.TP] = true
	}
	return nil
}

// kgoLogger adapts slog to kgo.Logger.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		k.l.Error(msg, keyvals...)
	case kgo.LogLevelWarn:
		k.l.Warn(msg, keyvals...)
	case kgo.LogLevelInfo:
		k.l.Info(msg, keyvals...)
	default:
		k.l.Debug(msg, keyvals...)
	}
}
