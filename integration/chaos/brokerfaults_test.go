//go:build integration

package chaos_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
	"github.com/tidemark/tidemark/internal/testbed"
)

// The broker faults of a three-node cluster. TestChaos deals
// them, beside the others, when the bed is a cluster — TIDEMARK_KAFKA_NODES=3
// scripts/testbed up, or make soak CLUSTER=3 — whose topic then has three
// replicas (min.insync.replicas 2) and whose producers write with acks=all:
// one broker at a time is killed (the leader of a consumed partition, or
// the group's coordinator), restarted in a rolling restart, or frozen past
// the broker session timeout. docs/chaos.md, "On a cluster".
const (
	faultKillLeader  = "kill-leader"      // SIGKILL the leader of a consumed partition
	faultKillCoord   = "kill-coordinator" // SIGKILL the group's coordinator
	faultRolling     = "rolling-restart"  // one node of a rolling restart (SIGTERM, start, in sync), counted per node
	faultPauseBroker = "pause-broker"     // SIGSTOP a partition leader for brokerPause, then SIGCONT
)

var brokerFaultKinds = []string{faultKillLeader, faultKillCoord, faultRolling, faultPauseBroker}

const (
	// brokerPause is longer than the broker's session with the controller
	// (broker.session.timeout.ms, 9 s by default), after which the
	// controller fences it and moves its leaderships, and than the
	// consumers' session timeout.
	brokerPause = 12 * time.Second
	// inSyncWithin bounds the wait, after a fault, until the node is back
	// and every partition has its three replicas in sync again: the next
	// fault must not take a second replica of a partition.
	inSyncWithin = 3 * time.Minute
	replicas     = 3
)

// faultWindow is when one fault ran, for attributing log lines to it.
type faultWindow struct {
	kind     string
	from, to time.Time
}

// brokerFaults injects the broker faults on a cluster bed; on a bed of
// one node it has no kinds.
type brokerFaults struct {
	tb           *testbed.Bed
	out          *bytes.Buffer // the bed's progress lines, shown when a verb fails
	nodes        []int32
	addrs        map[int32]string // each node's advertised address
	fl           *fleet
	mon          *monitor
	nf           *netFaults // for the partitions the topic has now
	topic, group string
	rolling      []int32 // the nodes the rolling restart under way has still to restart

	mu          sync.Mutex
	start       time.Time // see startedAt
	startSample *sample
	worstInSync time.Duration
}

func newBrokerFaults(tb *testbed.Bed, out *bytes.Buffer, nodes []int32, addrs map[int32]string, fl *fleet, mon *monitor, nf *netFaults, topic, group string) *brokerFaults {
	return &brokerFaults{tb: tb, out: out, nodes: nodes, addrs: addrs, fl: fl, mon: mon, nf: nf, topic: topic, group: group}
}

// begin notes the start of the fault, just before the bed's verb that
// makes it, after the look-ups that chose its node.
func (b *brokerFaults) begin() {
	b.mu.Lock()
	b.start, b.startSample = time.Now(), b.mon.latest()
	b.mu.Unlock()
}

// startedAt returns the time and the sample that the recovery from the
// fault just injected is measured from (see begin), as netFaults.startedAt.
func (b *brokerFaults) startedAt() (time.Time, *sample, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, s := b.start, b.startSample
	b.start, b.startSample = time.Time{}, nil
	return at, s, s != nil
}

// rollingUnderWay reports whether a rolling restart has nodes left: the
// run does not end, and nothing comes, between its nodes.
func (b *brokerFaults) rollingUnderWay() bool { return len(b.rolling) > 0 }

// stopKafka stops the nodes s names in mode m and makes the consumers'
// proxies of their addresses refuse connections (fleet.targetsDown);
// startKafka starts them and lets the proxies through again.
func (b *brokerFaults) stopKafka(ctx context.Context, s testbed.Service, m testbed.Mode) error {
	if err := b.verb("stop "+s.String(), func() error { return b.tb.Stop(ctx, s, m) }); err != nil {
		return err
	}
	b.fl.targetsDown(b.targets(s))
	return nil
}

func (b *brokerFaults) startKafka(ctx context.Context, s testbed.Service) error {
	if err := b.verb("start "+s.String(), func() error { return b.tb.Start(ctx, s) }); err != nil {
		return err
	}
	return b.fl.targetsUp(b.targets(s))
}

// targets returns the addresses of the nodes s names; all the consumers'
// targets for all of them (a bed of one node: its seed and advertised
// address).
func (b *brokerFaults) targets(s testbed.Service) []string {
	if s.Node == 0 {
		return b.fl.kafkaTargets
	}
	return []string{b.addrs[s.Node]}
}

// restartKafka is restart-kafka: the whole of Kafka down and up (on a
// cluster every node at once, a full outage).
func (b *brokerFaults) restartKafka(ctx context.Context, m testbed.Mode) error {
	all := testbed.Service{Kind: testbed.Kafka}
	if err := b.stopKafka(ctx, all, m); err != nil {
		return err
	}
	return b.startKafka(ctx, all)
}

// wantReplicas fails the test unless every partition of topic has n
// replicas: the broker faults on a cluster rely on it.
func wantReplicas(t *testing.T, adm *kadm.Client, topic string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		t.Fatalf("describing %s: %v", topic, err)
	}
	for _, p := range td[topic].Partitions.Sorted() {
		if len(p.Replicas) != n {
			t.Fatalf("%s/%d has replicas %v, want %d: the cluster bed's default.replication.factor is not %d", topic, p.Partition, p.Replicas, n, n)
		}
	}
}

// nodeAddrs returns each broker's advertised address.
func nodeAddrs(t *testing.T, adm *kadm.Client) map[int32]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs, err := adm.ListBrokers(ctx)
	if err != nil {
		t.Fatalf("listing the brokers, whose advertised addresses each consumer's proxies stand for: %v", err)
	}
	out := map[int32]string{}
	for _, b := range bs {
		out[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
	}
	return out
}

func (b *brokerFaults) partitions() int {
	b.nf.mu.Lock()
	defer b.nf.mu.Unlock()
	return b.nf.partitionsNow
}

func (b *brokerFaults) cluster() bool { return len(b.nodes) > 1 }

func (b *brokerFaults) kinds() []string {
	if !b.cluster() {
		return nil
	}
	return brokerFaultKinds
}

func (b *brokerFaults) handles(kind string) bool { return slices.Contains(brokerFaultKinds, kind) }

// expand turns the rolling restart of a shuffled deck into one entry per
// node, one after the other: a rolling restart is a fault per node, and
// nothing else comes between them.
func (b *brokerFaults) expand(deck []string) []string {
	i := slices.Index(deck, faultRolling)
	if i < 0 {
		return deck
	}
	more := make([]string, len(b.nodes)-1)
	for j := range more {
		more[j] = faultRolling
	}
	return slices.Insert(deck, i+1, more...)
}

// verb runs one of the bed's verbs, with its progress lines in the error.
func (b *brokerFaults) verb(what string, fn func() error) error {
	b.out.Reset()
	if err := fn(); err != nil {
		return fmt.Errorf("%s: %v\n%s", what, err, b.out)
	}
	return nil
}

func node(id int32) testbed.Service { return testbed.Service{Kind: testbed.Kafka, Node: id} }

func (b *brokerFaults) leaderOf(ctx context.Context, p int32) (int32, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return b.tb.Leader(qctx, b.topic, p)
}

// inject starts a broker fault and returns what it did. For a pause and a
// rolling restart's node the channel receives the outcome of the SIGCONT or
// of the restart, which run beside the wait for recovery (so that is
// measured from the fault, not from its end); a killed node stays down
// until settle.
func (b *brokerFaults) inject(ctx context.Context, bg *sync.WaitGroup, kind string, rng *rand.Rand) (string, <-chan error, error) {
	switch kind {
	case faultKillLeader, faultKillCoord:
		var id int32
		var detail string
		var err error
		if kind == faultKillLeader {
			p := int32(rng.IntN(b.partitions()))
			id, err = b.leaderOf(ctx, p)
			detail = fmt.Sprintf("node %d, leader of partition %d", id, p)
		} else {
			qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			id, err = b.tb.Coordinator(qctx, b.group)
			cancel()
			detail = fmt.Sprintf("node %d, the group's coordinator", id)
		}
		if err != nil {
			return "", nil, err
		}
		b.begin()
		return detail, nil, b.stopKafka(ctx, node(id), testbed.Crash)
	case faultRolling:
		if len(b.rolling) == 0 {
			b.rolling = slices.Clone(b.nodes)
		}
		id := b.rolling[0]
		b.rolling = b.rolling[1:]
		// The controlled shutdown here, the start beside the wait for
		// recovery: a sample taken while the node was still shutting down
		// (its leaderships moving, the consumers still committing) does
		// not count as recovered.
		b.begin()
		if err := b.stopKafka(ctx, node(id), testbed.Graceful); err != nil {
			return "", nil, err
		}
		done := make(chan error, 1)
		bg.Add(1)
		go func() {
			defer bg.Done()
			done <- b.startKafka(ctx, node(id))
		}()
		return fmt.Sprintf("node %d (%d of %d)", id, len(b.nodes)-len(b.rolling), len(b.nodes)), done, nil
	case faultPauseBroker:
		p := int32(rng.IntN(b.partitions()))
		id, err := b.leaderOf(ctx, p)
		if err != nil {
			return "", nil, err
		}
		b.begin()
		// The proxies stay open: a paused broker keeps its sockets, and
		// nothing answers on them.
		if err := b.verb("pause node", func() error { return b.tb.Pause(ctx, node(id)) }); err != nil {
			return "", nil, err
		}
		resumed := make(chan error, 1)
		bg.Add(1)
		go func() {
			defer bg.Done()
			sleep(ctx, brokerPause)
			resumed <- b.verb("resume node", func() error { return b.tb.Resume(context.Background(), node(id)) })
		}()
		return fmt.Sprintf("node %d, leader of partition %d, for %s", id, p, brokerPause), resumed, nil
	}
	return "", nil, fmt.Errorf("unknown broker fault %q", kind)
}

// settle, before the first fault and after any fault on a cluster, starts the nodes that do not run
// and waits until every partition has its replicas in sync again, so that
// the next fault cannot take a second replica of a partition. A node
// continued after a pause runs but may not be registered again yet (the
// controller fenced it): Start, which checks the cluster once, is only for
// a node that was stopped; WaitInSync waits for the registration. It
// returns how long that took.
func (b *brokerFaults) settle(ctx context.Context) (time.Duration, error) {
	if !b.cluster() {
		return 0, nil
	}
	t0 := time.Now()
	var st testbed.Status
	if err := b.verb("status", func() (err error) { st, err = b.tb.Status(ctx); return err }); err != nil {
		return 0, err
	}
	runs := map[testbed.Service]bool{}
	for _, v := range st.Servers {
		runs[v.Service] = v.PID > 0
	}
	for _, id := range b.nodes {
		if !runs[node(id)] {
			if err := b.startKafka(ctx, node(id)); err != nil {
				return 0, err
			}
		}
	}
	if err := b.tb.WaitInSync(ctx, inSyncWithin); err != nil {
		return 0, err
	}
	took := time.Since(t0)
	b.mu.Lock()
	b.worstInSync = max(b.worstInSync, took)
	b.mu.Unlock()
	return took, nil
}

// summarize adds what b kept to the summary.
func (b *brokerFaults) summarize(s *summary) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.Nodes = max(1, len(b.nodes))
	s.WorstBackInSync = b.worstInSync.Seconds()
}

// reportCommits logs the summary's refused and failed commits by fault and
// error.
func reportCommits(b *strings.Builder, s summary) {
	fmt.Fprintf(b, "  commits answered   %d OffsetCommit answers on the wire, %d retried by franz-go through a coordinator move",
		s.CommitsAnswered, s.CommitsRetried)
	writeByFault(b, s.CommitsRefused)
	b.WriteString("\n")
	fmt.Fprintf(b, "  failed commits     %d (%d final; the next commit sends the newest safe offsets)", s.CommitFailuresTotal, s.FinalCommitFailures)
	writeByFault(b, s.CommitFailures)
	b.WriteString("\n")
}

// writeByFault writes counts by fault and error, a line per fault.
func writeByFault(b *strings.Builder, byFault map[string]map[string]int) {
	kinds := make([]string, 0, len(byFault))
	for k := range byFault {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		var parts []string
		for code, c := range byFault[k] {
			parts = append(parts, fmt.Sprintf("%s %d", code, c))
		}
		sort.Strings(parts)
		fmt.Fprintf(b, "\n    during %-16s %s", k, strings.Join(parts, ", "))
	}
}

// unstick works around a franz-go v1.22.3 bug that would blind the monitor
// after a kill-coordinator: a client's OffsetFetch (kadm.FetchOffsets, a
// sharded request) to a cached group coordinator that died fails with
// "unable to dial: … connection refused" on every call and never looks
// the coordinator up again, since only the unsharded coordinator path
// drops a cached coordinator on a dial error (measured: 60 s of failures
// while a fresh client found the new coordinator at once). When the
// monitor's newest sample is over 2 s old, unstick sends a Heartbeat for
// the group with a member id that is no member's — an unsharded
// coordinator request: its failed dial drops the dead node's cached
// coordinators, and a live coordinator answers UNKNOWN_MEMBER_ID and
// changes nothing — and counts it.
func unstick(ctx context.Context, cl *kgo.Client, mon *monitor, group string, n *atomic.Int64) {
	for sleep(ctx, time.Second) {
		if s := mon.latest(); s == nil || time.Since(s.at) < 2*time.Second {
			continue
		}
		hb := kmsg.NewPtrHeartbeatRequest()
		hb.Group, hb.MemberID, hb.Generation = group, "tidemark-chaos-monitor", -1
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = cl.Request(hctx, hb)
		cancel()
		n.Add(1)
	}
}

// commitFailures reads the consumers' logs (JSON lines of slog) for the
// runner's failed commits — "commit failed; the next commit sends the
// newest safe offsets" and "final commit failed; …" — and counts them by
// the fault whose window holds their time ("between" outside every
// window) and by the error's Kafka code (the first upper-case
// word with an underscore in it, such as NOT_COORDINATOR; else the error's
// first 40 characters). It returns the final commits that failed as well.
func commitFailures(logDir string, windows []faultWindow) (map[string]map[string]int, int, error) {
	out := map[string]map[string]int{}
	final := 0
	logs, err := filepath.Glob(filepath.Join(logDir, "c*.log"))
	if err != nil {
		return nil, 0, err
	}
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), "commit failed") {
				continue
			}
			var e struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
				Err  string    `json:"err"`
			}
			if json.Unmarshal(line, &e) != nil || !strings.Contains(e.Msg, "commit failed") {
				continue
			}
			if strings.HasPrefix(e.Msg, "final commit failed") {
				final++
			}
			kind := windowOf(windows, e.Time)
			if out[kind] == nil {
				out[kind] = map[string]int{}
			}
			out[kind][kafkaCode(e.Err)]++
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, 0, fmt.Errorf("reading %s: %w", l, err)
		}
	}
	return out, final, nil
}

// windowOf returns the kind of the fault whose window holds at, "between
// faults" if none does.
func windowOf(windows []faultWindow, at time.Time) string {
	for _, w := range windows {
		if !at.Before(w.from) && !at.After(w.to) {
			return w.kind
		}
	}
	return "between faults"
}

// commitWatch counts the OffsetCommit answers that the consumers' broker
// connections carry, read off the wire by each consumer's proxies
// (kgocontact.WatchConn through tcpproxy.WrapTarget): how many commits the
// coordinator refused (an error on the group or on any partition), by
// error and by the fault during which they came. They are the answers the
// broker sent, counted when the proxy read them: one a blackhole then held
// back from its consumer counts all the same.
// franz-go retries a commit refused with NOT_COORDINATOR,
// COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS itself, after
// finding the coordinator again: those are the commits retried through a
// coordinator move, which the runner never sees (the last refusal of a
// commit franz-go then gave up on is among them, and among the failed
// commits of the logs too). A connection reset
// before its answer leaves that request uncounted (the reset fault counts
// those).
type commitWatch struct {
	mu      sync.Mutex
	answers []commitAnswer
}

type commitAnswer struct {
	at   time.Time
	code string // "ok" or the Kafka error
}

// wrap is a tcpproxy.WrapTarget for a consumer's broker proxies.
func (w *commitWatch) wrap(c net.Conn) net.Conn { return kgocontact.WatchConn(c, w.answer) }

func (w *commitWatch) answer(a kgocontact.Answer) {
	if a.Key != int16(kmsg.OffsetCommit) {
		return
	}
	code := "ok"
	switch err := cmp.Or(a.Err, a.PartErr); {
	case !a.Decoded:
		code = "undecoded"
	case err != nil:
		code = err.Error()
		var ke *kerr.Error
		if errors.As(err, &ke) {
			code = ke.Message
		}
	}
	w.mu.Lock()
	w.answers = append(w.answers, commitAnswer{time.Now(), code})
	w.mu.Unlock()
}

// retriedByFranz reports whether franz-go retries a commit the coordinator
// refused with code within the same commit.
func retriedByFranz(code string) bool {
	switch code {
	case kerr.NotCoordinator.Message, kerr.CoordinatorNotAvailable.Message, kerr.CoordinatorLoadInProgress.Message:
		return true
	}
	return false
}

// summarize adds the counts to s: every answer, the refused ones by fault
// and error, and those franz-go retried.
func (w *commitWatch) summarize(s *summary, windows []faultWindow) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.CommitsRefused = map[string]map[string]int{}
	for _, a := range w.answers {
		if a.code == "undecoded" {
			s.CommitsUndecoded++
			continue
		}
		s.CommitsAnswered++
		if a.code == "ok" {
			continue
		}
		kind := windowOf(windows, a.at)
		if s.CommitsRefused[kind] == nil {
			s.CommitsRefused[kind] = map[string]int{}
		}
		s.CommitsRefused[kind][a.code]++
		if retriedByFranz(a.code) {
			s.CommitsRetried++
		}
	}
}

// kafkaCode names an error by its Kafka code: the first word like
// NOT_COORDINATOR in it; else the first cause in parentheses (the franz
// adapter's "commit failed for t/2 (context deadline exceeded), …"), a
// refused dial without its address; at most 60 characters.
func kafkaCode(s string) string {
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return !(r == '_' || r >= 'A' && r <= 'Z') }) {
		if strings.Contains(w, "_") && len(w) > 3 {
			return w
		}
	}
	if _, rest, ok := strings.Cut(s, "("); ok {
		if cause, _, ok := strings.Cut(rest, ")"); ok {
			s = cause
		}
	}
	// One name for a refused dial to any address ("unable to dial: dial
	// tcp 127.0.0.1:33985: connect: connection refused").
	if strings.HasPrefix(s, "unable to dial") && strings.HasSuffix(s, "connection refused") {
		return "unable to dial: connection refused"
	}
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
