//go:build integration && cluster

package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/testbed"
)

// The broker faults of a three-node cluster (issue 19), on a bed that
// scripts/testbed up --cluster 3 started: the suite's fleet of orders
// processes consumes a topic of three replicas (min.insync.replicas 2)
// while two producers write with acks=all, and one broker at a time is
// killed (the leader of a consumed partition, or the group's coordinator),
// restarted in a rolling restart, or frozen past the broker session
// timeout. The checks are TestChaos's. Run it alone on the cluster bed:
//
//	TIDEMARK_KAFKA_NODES=3 scripts/testbed up && source .testbed/env
//	go test -race -count=1 -v -tags 'integration cluster' -run '^TestChaosCluster$' ./integration/chaos/
//
// or make soak CLUSTER=3 DURATION=30m. docs/chaos.md, "On a cluster".

// The kinds of broker fault.
const (
	faultKillLeader  = "kill-leader"      // SIGKILL the leader of a consumed partition
	faultKillCoord   = "kill-coordinator" // SIGKILL the group's coordinator
	faultRolling     = "rolling-restart"  // one node of a rolling restart (SIGTERM, start, in sync), counted per node
	faultPauseBroker = "pause-broker"     // SIGSTOP a partition leader for brokerPause, then SIGCONT
)

var clusterFaultKinds = []string{faultKillLeader, faultKillCoord, faultRolling, faultPauseBroker}

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

// clusterSummary is TestChaosCluster's summary (TIDEMARK_CHAOS_SUMMARY).
type clusterSummary struct {
	Seed            uint64                 `json:"seed"`
	Nodes           int                    `json:"nodes"`
	FaultPhase      float64                `json:"fault_phase_s"`
	Total           float64                `json:"total_s"`
	Partitions      int                    `json:"partitions"`
	Produced        int                    `json:"produced"`
	ProduceFailed   int64                  `json:"produce_failed"`
	ConsumersRun    int                    `json:"consumers_started"`
	Faults          map[string]*faultStats `json:"faults"`
	FaultsTotal     int                    `json:"faults_total"`
	WorstRecovery   float64                `json:"worst_recovery_s"`
	WorstKind       string                 `json:"worst_recovery_fault"`
	WorstBackInSync float64                `json:"worst_back_in_sync_s"`
	// CommitFailures counts the consumers' failed commits (the runner's
	// "commit failed" log lines: franz-go gave up on the request, after
	// its own retries of NOT_COORDINATOR and the like) by the fault during
	// which they were logged and by error.
	CommitFailures      map[string]map[string]int `json:"commit_failures"`
	CommitFailuresTotal int                       `json:"commit_failures_total"`
	FinalCommitFailures int                       `json:"final_commit_failures"`
	FinalCatchUp        float64                   `json:"final_catch_up_s"`
	Samples             int                       `json:"offset_samples"`
	SamplesFailed       int                       `json:"offset_samples_failed"`
	Lost                int                       `json:"lost"`
	Duplicated          int                       `json:"duplicated"`
	OrderViolations     int                       `json:"key_order_violations"`
	BackwardCommits     int                       `json:"backward_commits"`
	DeadLettered        int64                     `json:"dead_lettered"`
	Pass                bool                      `json:"pass"`
}

// faultWindow is when one fault ran, for attributing log lines to it.
type faultWindow struct {
	kind     string
	from, to time.Time
}

// TestChaosCluster runs the broker faults; see the comment above.
func TestChaosCluster(t *testing.T) {
	began := time.Now()
	duration := envDuration(t, "TIDEMARK_CHAOS_DURATION", 2*time.Minute)
	rate := envInt(t, "TIDEMARK_CHAOS_RATE", 300)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TIDEMARK_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TIDEMARK_CHAOS_SEED=%q: want an unsigned integer", s)
		}
		seed = v
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	t.Logf("chaos cluster: seed %d (replay with TIDEMARK_CHAOS_SEED=%d), %s of faults, %d orders/s", seed, seed, duration, rate)

	brokers := bed.Kafka(t)
	tb, tbOut := openBed(t, brokers)
	nodes, err := tb.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != replicas {
		t.Fatalf("TestChaosCluster needs the bed's three-node cluster (scripts/testbed up --cluster 3); this bed has %d Kafka node(s)\n%s",
			len(nodes), bed.StartHint)
	}
	ctx := context.Background()
	// The bed's verbs, their progress lines shown only when they fail.
	verb := func(what string, fn func() error) error {
		tbOut.Reset()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %v\n%s", what, err, tbOut)
		}
		return nil
	}
	node := func(id int32) testbed.Service { return testbed.Service{Kind: testbed.Kafka, Node: id} }
	// Whatever a failed fault left stopped or paused is started again, so
	// the bed serves whatever runs next.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		tbOut.Reset()
		if err := tb.Start(ctx, testbed.Service{Kind: testbed.Kafka}); err != nil {
			t.Logf("cleanup: start kafka: %v\n%s", err, tbOut)
		}
	})
	if err := tb.WaitInSync(ctx, inSyncWithin); err != nil {
		t.Fatalf("before the run: %v", err)
	}

	pool := bed.PG(t)
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	adm := bed.Admin(t)
	// bed.Topic makes one replica; the cluster's topic has three (the
	// orders processes create the dead-letter topic with the broker's
	// default, three too).
	topic, group := fmt.Sprintf("chaos-cluster-%d", time.Now().UnixNano()), bed.Group(t)
	dlq := topic + ".dlq"
	if r, err := adm.CreateTopic(ctx, partitions, replicas, nil, topic); err != nil || r.Err != nil {
		t.Fatalf("create %s: %v %v", topic, err, r.Err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopic(ctx, topic)
		_, _ = adm.DeleteTopic(ctx, dlq)
	})
	if err := waitFor(ctx, time.Minute, func() bool {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := adm.ListEndOffsets(lctx, topic)
		return err == nil && l.Error() == nil && len(l[topic]) == partitions
	}); err != nil {
		t.Fatalf("%s: not every partition answered ListOffsets within a minute", topic)
	}

	logDir := logDirectory(t)
	bin := filepath.Join(t.TempDir(), "orders")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/orders").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/orders: %v\n%s", err, out)
	}
	dsn := os.Getenv("TIDEMARK_PG_DSN")
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	// As TestChaos (which says why).
	svcDSN := dsn + sep + "search_path=" + schema + "&synchronous_commit=on&idle_in_transaction_session_timeout=3000"
	args := []string{"-brokers", strings.Join(brokers, ","), "-dsn", svcDSN, "-group", group, "-topic", topic,
		"-dlq", dlq, "-http", "127.0.0.1:0", "-concurrency", "32", "-session-timeout", sessionTimeout.String()}
	fl := newFleet(t, bin, logDir, args, []string{"TIDEMARK_SHUTDOWN_BUDGET=10s"})

	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	t.Cleanup(func() { stopRun(); bg.Wait() })
	// The monitor's client is its own, for unstick below.
	mcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mcl.Close)
	mon := newMonitor(kadm.NewClient(mcl), group, topic, partitions, sampleEvery, false)
	bg.Add(2)
	go func() { defer bg.Done(); mon.run(runCtx) }()
	var unstuck atomic.Int64
	go func() { defer bg.Done(); unstick(runCtx, mcl, mon, group, &unstuck) }()

	// Two producers, acks=all (franz-go's default, idempotent): a record
	// they fail to write is not in the topic, and the topic read back is
	// the truth.
	prodCtx, stopProducing := context.WithCancel(runCtx)
	var produced, prodFailed atomic.Int64
	var prodWG sync.WaitGroup
	prodErr := make(chan error, 2)
	for k := range 2 {
		prodWG.Add(1)
		bg.Add(1)
		go func() {
			defer bg.Done()
			defer prodWG.Done()
			prodErr <- produce(runCtx, prodCtx, brokers, topic, k, 2, rate/2, &produced, &prodFailed)
		}()
	}
	for range initialProcs {
		if _, err := fl.start(); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitFor(runCtx, time.Minute, func() bool {
		s := mon.latest()
		if s == nil {
			return false
		}
		for _, c := range s.committed {
			if c <= 0 {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("the consumers did not start committing every partition within a minute (logs in %s)", logDir)
	}
	t.Logf("chaos cluster: %d consumers committing on all %d partitions after %s", initialProcs, partitions, time.Since(began).Round(time.Millisecond))

	stats := map[string]*faultStats{}
	for _, k := range clusterFaultKinds {
		stats[k] = &faultStats{}
	}
	var worst, worstInSync time.Duration
	var worstKind string
	var windows []faultWindow
	// measure waits for the recovery from a fault at at (the last sample
	// before it was before), records it, and fails the test when there is
	// none within recoverWithin.
	measure := func(n int, kind, detail string, before *sample, at time.Time) {
		t.Helper()
		took, stuck, ok := waitRecovered(runCtx, mon, before, at, time.Now(), recoverWithin)
		if !ok {
			s := mon.latest()
			t.Fatalf("fault %d (%s, %s) at %s: not recovered after %s: partitions %v stuck (committed %v, end %v); consumer logs in %s; seed %d",
				n, kind, detail, at.Format("15:04:05.000"), recoverWithin, stuck, s.committed, s.end, logDir, seed)
		}
		st := stats[kind]
		st.Count++
		st.total += took
		st.WorstRecovery = max(st.WorstRecovery, took.Seconds())
		if took > worst {
			worst, worstKind = took, kind
		}
		t.Logf("chaos cluster: fault %2d %-16s %-44s recovered in %s (lag %d)", n, kind, detail, took.Round(10*time.Millisecond), mon.latest().lag())
	}
	// backInSync starts node id if it does not run and waits until every
	// partition has its replicas in sync again. A node continued after a
	// pause runs but may not be registered again yet (the controller
	// fenced it), so Start, which checks the cluster once, is only for a
	// node that was stopped; WaitInSync waits for the registration.
	backInSync := func(id int32) time.Duration {
		t.Helper()
		t0 := time.Now()
		if err := verb(fmt.Sprintf("start node %d", id), func() error {
			st, err := tb.Status(runCtx)
			if err != nil {
				return err
			}
			for _, v := range st.Servers {
				if v.Service == node(id) && v.PID > 0 {
					return nil // runs
				}
			}
			return tb.Start(runCtx, node(id))
		}); err != nil {
			t.Fatal(err)
		}
		if err := tb.WaitInSync(runCtx, inSyncWithin); err != nil {
			t.Fatalf("node %d back: %v; seed %d", id, err, seed)
		}
		took := time.Since(t0)
		worstInSync = max(worstInSync, took)
		return took
	}
	leaderOf := func(p int32) int32 {
		t.Helper()
		qctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
		defer cancel()
		id, err := tb.Leader(qctx, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	var deck []string
	faultStart := time.Now()
	round, n := 0, 0
	for {
		if len(deck) == 0 {
			if round > 0 && time.Since(faultStart) >= duration {
				break
			}
			round++
			deck = slices.Clone(clusterFaultKinds)
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		if round > 1 && time.Since(faultStart) >= duration {
			break
		}
		kind := deck[0]
		deck = deck[1:]
		w := faultWindow{kind: kind, from: time.Now()}
		switch kind {
		case faultKillLeader, faultKillCoord:
			var id int32
			var detail string
			if kind == faultKillLeader {
				p := int32(rng.IntN(partitions))
				id = leaderOf(p)
				detail = fmt.Sprintf("node %d, leader of partition %d", id, p)
			} else {
				qctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
				id, err = tb.Coordinator(qctx, group)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				detail = fmt.Sprintf("node %d, coordinator of the group", id)
			}
			n++
			before, at := mon.latest(), time.Now()
			if err := verb("kill node", func() error { return tb.Stop(runCtx, node(id), testbed.Crash) }); err != nil {
				t.Fatal(err)
			}
			measure(n, kind, detail, before, at)
			t.Logf("chaos cluster:    node %d back, all in sync, in %s", id, backInSync(id).Round(10*time.Millisecond))
		case faultRolling:
			for _, id := range nodes {
				n++
				before, at := mon.latest(), time.Now()
				// The restart runs beside the wait for recovery, so
				// that is measured from the stop, not from the end of
				// the restart.
				restarted := make(chan time.Duration, 1)
				bg.Add(1)
				go func() {
					defer bg.Done()
					if err := verb("restart node", func() error { return tb.Restart(runCtx, node(id), testbed.Graceful) }); err != nil {
						t.Error(err)
					}
					restarted <- time.Since(at)
				}()
				measure(n, kind, fmt.Sprintf("node %d (round %d)", id, round), before, at)
				up := <-restarted
				if t.Failed() {
					t.FailNow()
				}
				t.Logf("chaos cluster:    node %d down+up %s, all in sync %s later", id, up.Round(10*time.Millisecond), backInSync(id).Round(10*time.Millisecond))
			}
		case faultPauseBroker:
			p := int32(rng.IntN(partitions))
			id := leaderOf(p)
			n++
			before, at := mon.latest(), time.Now()
			if err := verb("pause node", func() error { return tb.Pause(runCtx, node(id)) }); err != nil {
				t.Fatal(err)
			}
			resumed := make(chan error, 1)
			bg.Add(1)
			go func() {
				defer bg.Done()
				sleep(runCtx, brokerPause)
				resumed <- verb("resume node", func() error { return tb.Resume(context.Background(), node(id)) })
			}()
			measure(n, kind, fmt.Sprintf("node %d, leader of partition %d, for %s", id, p, brokerPause), before, at)
			if err := <-resumed; err != nil {
				t.Fatal(err)
			}
			backInSync(id)
		}
		w.to = time.Now()
		windows = append(windows, w)
		if u := fl.unexpected(); len(u) > 0 {
			t.Fatalf("a consumer died without being told to: %s; seed %d", strings.Join(u, "; "), seed)
		}
		sleep(runCtx, time.Duration(500+rng.IntN(2500))*time.Millisecond)
	}
	faultPhase := time.Since(faultStart)

	// The end, as TestChaos: producers stop, the consumers catch up and
	// stop.
	stopProducing()
	prodWG.Wait()
	for range 2 {
		if err := <-prodErr; err != nil {
			t.Fatalf("producer: %v", err)
		}
	}
	catchUp := time.Now()
	if err := waitFor(runCtx, 3*time.Minute, func() bool { s := mon.latest(); return s != nil && s.at.After(catchUp) && s.caughtUp() }); err != nil {
		s := mon.latest()
		t.Fatalf("the group did not commit the end offsets within 3 minutes of the last fault: committed %v, end %v; logs in %s; seed %d",
			s.committed, s.end, logDir, seed)
	}
	catchUpTook := time.Since(catchUp)
	for _, c := range fl.running(false) {
		code, err := fl.stop(c, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code != 0 {
			t.Errorf("%s exited %d after the final SIGTERM, want 0 (log %s)", c.name, code, c.log)
		}
	}
	if u := fl.unexpected(); len(u) > 0 {
		t.Errorf("a consumer died without being told to: %s", strings.Join(u, "; "))
	}
	stopRun()
	bg.Wait()

	recs := readBack(t, brokers, topic)
	res := check(t, pool, group, topic, recs, true)
	dead := deadLettered(t, dlq)
	backward := mon.backwardCommits()
	ok, failed := mon.counts()
	t.Logf("chaos cluster: the monitor's client was made to forget a dead coordinator %d times", unstuck.Load())
	commits, final, err := commitFailures(logDir, windows)
	if err != nil {
		t.Error(err)
	}
	sum := clusterSummary{
		Seed: seed, Nodes: len(nodes), FaultPhase: faultPhase.Seconds(), Total: time.Since(began).Seconds(), Partitions: partitions,
		Produced: len(recs), ProduceFailed: prodFailed.Load(), ConsumersRun: fl.started(), Faults: stats,
		WorstRecovery: worst.Seconds(), WorstKind: worstKind, WorstBackInSync: worstInSync.Seconds(),
		CommitFailures: commits, FinalCommitFailures: final, FinalCatchUp: catchUpTook.Seconds(),
		Samples: ok, SamplesFailed: failed, Lost: res.lost, Duplicated: res.duplicated,
		OrderViolations: res.orderViolations, BackwardCommits: len(backward), DeadLettered: dead,
	}
	for _, st := range stats {
		sum.FaultsTotal += st.Count
		if st.Count > 0 {
			st.MeanRecovery = (st.total / time.Duration(st.Count)).Seconds()
		}
	}
	for _, byErr := range commits {
		for _, c := range byErr {
			sum.CommitFailuresTotal += c
		}
	}
	for _, b := range backward {
		t.Errorf("committed offset went backward: %s", b)
	}
	if dead > 0 {
		t.Errorf("%d orders were dead-lettered: no order of this run is malformed", dead)
	}
	if final > 0 {
		// A final commit that fails leaves records to be delivered again:
		// allowed (the inbox skips them), worth seeing.
		t.Logf("chaos cluster: %d final commits (of a revoke or a stop) failed", final)
	}
	sum.Pass = !t.Failed()
	clusterReport(t, sum)
	if sum.Pass {
		_ = os.RemoveAll(logDir)
	} else {
		t.Logf("chaos cluster: consumer logs kept in %s; replay with TIDEMARK_CHAOS_SEED=%d", logDir, seed)
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
			kind := "between faults"
			for _, w := range windows {
				if !e.Time.Before(w.from) && !e.Time.After(w.to) {
					kind = w.kind
					break
				}
			}
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

// kafkaCode names an error by its Kafka code: the first word like
// NOT_COORDINATOR in it; else the first cause in parentheses (the franz
// adapter's "commit failed for t/2 (context deadline exceeded), …"); else
// its first 40 characters.
func kafkaCode(s string) string {
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return !(r == '_' || r >= 'A' && r <= 'Z') }) {
		if strings.Contains(w, "_") && len(w) > 3 {
			return w
		}
	}
	if _, rest, ok := strings.Cut(s, "("); ok {
		if cause, _, ok := strings.Cut(rest, ")"); ok {
			return cause
		}
	}
	if len(s) > 40 {
		return s[:40]
	}
	return s
}

// clusterReport logs the summary and writes it as JSON to
// TIDEMARK_CHAOS_SUMMARY when that is set.
func clusterReport(t *testing.T, s clusterSummary) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos cluster summary (%d nodes, seed %d)\n", s.Nodes, s.Seed)
	fmt.Fprintf(&b, "  fault phase        %.1fs (run %.1fs), %d partitions x %d replicas, %d consumers started\n",
		s.FaultPhase, s.Total, s.Partitions, replicas, s.ConsumersRun)
	fmt.Fprintf(&b, "  produced           %d orders, acks=all (%d produce failures)\n", s.Produced, s.ProduceFailed)
	fmt.Fprintf(&b, "  faults survived    %d\n", s.FaultsTotal)
	for _, k := range clusterFaultKinds {
		f := s.Faults[k]
		fmt.Fprintf(&b, "    %-17s %3d   recovery worst %5.1fs  mean %5.1fs\n", k, f.Count, f.WorstRecovery, f.MeanRecovery)
	}
	fmt.Fprintf(&b, "  worst recovery     %.1fs (%s); worst node back and in sync %.1fs\n", s.WorstRecovery, s.WorstKind, s.WorstBackInSync)
	fmt.Fprintf(&b, "  failed commits     %d (%d final)", s.CommitFailuresTotal, s.FinalCommitFailures)
	kinds := make([]string, 0, len(s.CommitFailures))
	for k := range s.CommitFailures {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		var parts []string
		for code, c := range s.CommitFailures[k] {
			parts = append(parts, fmt.Sprintf("%s %d", code, c))
		}
		sort.Strings(parts)
		fmt.Fprintf(&b, "\n    during %-16s %s", k, strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "\n  final catch-up     %.1fs\n", s.FinalCatchUp)
	fmt.Fprintf(&b, "  offset samples     %d (%d failed during faults), backward commits %d\n", s.Samples, s.SamplesFailed, s.BackwardCommits)
	fmt.Fprintf(&b, "  lost %d, duplicated %d, key order violations %d, dead-lettered %d\n", s.Lost, s.Duplicated, s.OrderViolations, s.DeadLettered)
	fmt.Fprintf(&b, "  result             %s", map[bool]string{true: "PASS", false: "FAIL"}[s.Pass])
	t.Log(b.String())
	if path := os.Getenv("TIDEMARK_CHAOS_SUMMARY"); path != "" {
		js, err := json.MarshalIndent(s, "", "  ")
		if err == nil {
			err = os.WriteFile(path, append(js, '\n'), 0o644)
		}
		if err != nil {
			t.Errorf("writing the summary to %s: %v", path, err)
		}
	}
}
