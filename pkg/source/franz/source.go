package franz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/kgocontact"
	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/args"
	"github.com/tidemark/tidemark/pkg/source/internal/kgorec"
)

// Source is a runner.Source and runner.DeadLetterWriter over one franz-go
// client that is a member of one consumer group. Create it with New and hand
// it to runner.New; the runner calls Run, Pause, Resume, Commit and Close.
// Its methods are safe for concurrent use. Pause and Resume never block, and
// may be called from inside any Sink call Run or the group callbacks make
// (the runner pauses partitions before Fetched and Assigned return); Commit
// may run while Run waits in Sink.Fetched. A Source runs once.
//
// Its locks, each owned by one type, taken and released within one of its
// methods, and never held across a broker round trip or a call into the
// runner's Sink:
//
//   - hold.mu: the records taken from the client and not handed over (see
//     hold). Taken before flow.mu, never after. Held across SetOffsets,
//     which sends no request (see hold.polled).
//   - flow.mu: what the runner paused and what the client was told (see
//     flow). Held across PauseFetchPartitions and ResumeFetchPartitions,
//     which send no request.
//   - ownership.mu: the partitions owned and the commits admitted for them
//     (see ownership). Nothing is called under it.
//   - limMu: the fetch sizes (LimitFetch, fitBrokers, expansionHook). Held
//     across UpdateFetchMaxBytes, which stores two atomics.
//   - mu: sink and runCtx. Nothing is called under it.
type Source struct {
	cl     *kgo.Client
	cfg    config
	group  string
	topics []string
	log    *slog.Logger

	// fetches is k, the client's MaxConcurrentFetches; limits what
	// LimitFetch derived from it (nil before).
	fetches int
	limits  atomic.Pointer[fetchLimits]
	lowered atomic.Bool // expansionHook lowered the limits (and logged it)
	// limMu serializes resizing the fetches (LimitFetch, fitBrokers, the
	// expansion hook) and guards sizing; it is never held across I/O.
	limMu  sync.Mutex
	sizing *fetchSizing
	// brokers is the number of brokers fitBrokers last sized for (Run's
	// goroutine only).
	brokers int

	started   atomic.Bool
	closing   atomic.Bool
	closed    chan struct{} // closed by Close before the client is closed
	closeOnce sync.Once

	// mu guards sink and runCtx, which Run sets before it subscribes to the
	// topics, so that no partition callback can run without them; it is
	// held only to read or set them (sinkOf). runCtx is
	// Run's ctx, kept because franz-go calls the callbacks on its own
	// goroutines and their Sink calls must end with Run.
	mu     sync.Mutex
	sink   runner.Sink
	runCtx context.Context

	own *ownership // the partitions this member owns, and the commits sent for them

	// recBufs are emptied (and cleared) record buffers, reused by the
	// next poll (Run's goroutine only): the runner copies the records it is
	// handed, and allocating a poll's worth of records anew each time was
	// most of the garbage a fast consumer made. It holds at most as many
	// buffers as one poll had partitions.
	recBufs [][]runner.Record

	hold *hold // records taken from the client, not handed over yet
	flow *flow // Pause, Resume and what the client was told

	contact kgocontact.Contact // the coordinator's last answer (Membership)
	joined  joinReport         // whether the runner heard of this membership
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("franz: source closed")

// ErrAlreadyRun is returned by Run when the Source already ran.
var ErrAlreadyRun = errors.New("franz: Run called more than once")

// ErrNotOwned is matched (with errors.Is) by a *CommitError that left out
// partitions this member does not own.
var ErrNotOwned = errors.New("franz: partition not owned by this member")

// New returns a Source that joins group and consumes topics once Run is
// called. It creates the franz-go client (which does not connect yet) and
// returns a *ConfigError naming the first invalid argument or option, or the
// client's error for invalid ClientOptions. Close releases the client.
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
		cfg:    cfg,
		group:  group,
		topics: slices.Clone(topics),
		log:    cfg.logger.With("component", "tidemark.franz", "group", group),
		closed: make(chan struct{}),
		own:    newOwnership(),
	}

	// Overridable defaults first, then the caller's client options, then
	// what the adapter depends on, so that those cannot be overridden.
	kopts := []kgo.Opt{
		kgo.WithLogger(kgoLogger{cfg.logger.With("component", "franz-go", "group", group)}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(defaultFetchMaxWait),
		kgo.MaxConcurrentFetches(defaultConcurrentFetches),
	}
	kopts = append(kopts, cfg.clientOpts...)
	kopts = append(kopts,
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(group),
		// No topics yet: Run subscribes once the sink is set, so the
		// member joins the group only when it can report to the runner.
		kgo.ConsumeTopics(),
		kgo.DisableAutoCommit(),
		// Rebalance callbacks run only between AllowRebalance and the
		// next non-empty poll, so the runner has recorded every record
		// handed over before it hears of a revoke or loss.
		kgo.BlockRebalanceOnPoll(),
		// Control records (transaction markers) carry the offsets that
		// let the committed offset reach the end of a transactional
		// partition; Run filters them out and keeps only their offsets.
		kgo.KeepControlRecords(),
		kgo.Balancers(cfg.groupBalancers()...),
		kgo.SessionTimeout(cfg.sessionTimeout),
		kgo.RebalanceTimeout(cfg.rebalanceTimeout),
		kgo.HeartbeatInterval(cfg.heartbeatInterval),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.WithHooks(expansionHook{s}, &s.contact),
	)
	if cfg.instanceSet {
		kopts = append(kopts, kgo.InstanceID(cfg.instanceID))
	}
	if cfg.serverSide {
		kopts = append(kopts, kgo.ServerSideBalancer())
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("franz: creating the client: %w", err)
	}
	if regex, _ := cl.OptValue(kgo.ConsumeRegex).(bool); regex {
		cl.Close()
		return nil, &ConfigError{Option: "ClientOptions", Reason: "kgo.ConsumeRegex is not supported: the source consumes the topics given to New"}
	}
	s.fetches, _ = cl.OptValue(kgo.MaxConcurrentFetches).(int)
	if s.fetches < 0 {
		cl.Close()
		return nil, &ConfigError{Option: "ClientOptions", Reason: fmt.Sprintf("kgo.MaxConcurrentFetches(%d) is unbounded: the memory bound (runner.MaxBufferedBytes) needs a limit", s.fetches)}
	}
	s.cl, s.flow = cl, newFlow(cl)
	s.hold = newHold(cl, s.flow)
	return s, nil
}

// Client returns the franz-go client, for admin requests (kadm.NewClient) or
// metrics. Do not poll, commit, pause or close through it.
func (s *Source) Client() *kgo.Client { return s.cl }

// FetchError is a fetch error that stopped Run: the client was closed under
// it, or the broker refused authentication or authorization.
type FetchError struct {
	// TP is the partition the error was reported on; empty for a
	// client-wide error.
	TP  runner.TP
	Err error
}

func (e *FetchError) Error() string {
	if e.TP.Topic == "" {
		return "franz: fetch: " + e.Err.Error()
	}
	return "franz: fetch " + e.TP.String() + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *FetchError) Unwrap() error { return e.Err }

// Group returns the consumer group the Source was created for. The runner reads
// it (runner.Grouped) for messaging.consumer.group.name on its spans and
// metrics. It is safe to call at any time.
func (s *Source) Group() string { return s.group }

var _ runner.Grouped = (*Source)(nil)

// Run joins the group and consumes until ctx is done, Close is called, or a
// fatal fetch error (returned as a *FetchError). It reports assignments,
// revokes, losses and fetched records to sink and blocks while the sink
// acts on them. Once the sink returns runner.ErrStopped, Run stops fetching
// but keeps answering the group's callbacks, and returns when ctx is done or
// Close is called. Run returns nil when ctx ends or after Close.
func (s *Source) Run(ctx context.Context, sink runner.Sink) error {
	if sink == nil {
		return errors.New("franz: Run with a nil sink")
	}
	if !s.started.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	if s.closing.Load() {
		return ErrClosed
	}
	s.mu.Lock()
	s.sink, s.runCtx = sink, ctx
	s.mu.Unlock()
	s.cl.AddConsumeTopics(s.topics...)
	s.log.Info("joining the group", "topics", s.topics)

	// Ask the runner for its budget before the first poll too: a poll of
	// MaxPollRecords could otherwise push a partition past a high water mark
	// below it.
	n, err := sink.Fetched(ctx, nil)
	if err != nil {
		if errors.Is(err, runner.ErrStopped) || ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("franz: asking the runner for a budget: %w", err)
	}
	budget := min(max(n, 1), s.cfg.maxPollRecords)
	room := max(n, 1)
	for {
		// Hand over what is held for unpaused partitions, as far as the
		// runner's budget goes, while the client fetches the next batch.
		if n, handed, err := s.hold.handOver(ctx, sink, budget); handed {
			if err != nil {
				return s.fetchedErr(ctx, err)
			}
			budget = min(max(n, 1), s.cfg.maxPollRecords)
			room = max(n, 1)
			continue
		}
		// Nothing to hand over. If what is held belongs to partitions
		// the runner paused, give it a moment to resume them before
		// polling: polling now costs a copy of those records (park), and
		// the client drops what it fetched for paused partitions, to
		// fetch it again later; with fast handlers a pause lasts well
		// under parkWait.
		if s.hold.holding() && s.flow.awaitResume(ctx, s.closed) {
			continue
		}
		// Take the next fetch from the client, all of it if the runner
		// has room (holdCap). Taking everything it buffered lets it send
		// the next fetch request at once, so fetching and decoding
		// overlap with the runner's work instead of waiting for it:
		// franz-go fetches from a broker again only once its buffered
		// fetch was taken. Records of partitions still paused are
		// parked first, so the poll's buffers can be reused.
		s.reuse(s.hold.park())
		s.fitBrokers()
		fetches, woken := s.poll(ctx, s.holdCap(room))
		batches, stop, err := s.batches(ctx, fetches)
		s.hold.polled(batches)
		// Only now, with every record of the poll held (and dropped
		// there by a revoke or loss before the runner hears of it), may a
		// rebalance callback run. AllowRebalance without a poll that
		// returned records is harmless.
		s.cl.AllowRebalance()
		switch {
		case err != nil:
			return err
		case stop || (ctx.Err() != nil && !woken):
			return nil
		}
	}
}

// fetchedErr turns an error from Sink.Fetched into Run's result.
func (s *Source) fetchedErr(ctx context.Context, err error) error {
	if errors.Is(err, runner.ErrStopped) {
		// The runner is stopping: its Sink calls answer ErrStopped at
		// once, so the callbacks franz-go runs while we wait (and during
		// Close) do not block.
		s.log.Debug("runner stopped; no more fetching")
		select {
		case <-ctx.Done():
		case <-s.closed:
		}
		return nil
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("franz: handing records to the runner: %w", err)
}

// WriteDeadLetter produces rec's key, value and headers to topic and returns
// once the broker acknowledged the write (acks=all, idempotent: franz-go's
// producer defaults, so on a secured cluster the principal needs write and
// idempotent-write permission) or with the produce error; ctx bounds the
// wait. The topic must exist: a produce to a missing topic fails with
// kerr.UnknownTopicOrPartition after the client's retries, unless the
// broker creates topics on demand. It is safe to call concurrently.
func (s *Source) WriteDeadLetter(ctx context.Context, topic string, rec runner.Record) error {
	return kgorec.WriteDeadLetter(ctx, s.cl, "franz", topic, rec)
}

// Close leaves the group and closes the client, waiting for franz-go to
// finish (a dynamic member sends LeaveGroup so its partitions move at once;
// a static member, see InstanceID, does not). The runner calls it after its
// final commit; the revoke franz-go reports while leaving reaches a stopped
// runner and returns at once. Close is safe to call more than once: a call
// after the first returned returns at once, one concurrent with it waits
// for it. Run returns after Close.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		close(s.closed)
		s.cl.Close()
		s.log.Info("left the group and closed the client")
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
