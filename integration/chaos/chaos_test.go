//go:build integration

package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/testbed"
	"github.com/tidemark/tidemark/pkg/inbox"
)

// The knobs of a run; docs/chaos.md lists them.
const (
	partitions     = 8
	customers      = 200 // keys; 25 per partition on average
	sessionTimeout = 6 * time.Second
	pauseFor       = sessionTimeout + 2*time.Second // SIGSTOP → SIGCONT
	sampleEvery    = 250 * time.Millisecond
	recoverWithin  = 2 * time.Minute // a fault not recovered by then is a hang
	initialProcs   = 3
	maxProcs       = 5
)

// mode is the group the consumers form: "group", a consumer group (the
// default), or "share", a share group (KIP-932; examples/orders -mode
// share): every consumer reads every partition, there are no committed
// offsets (progress is read from the share-partition lag) and no key order
// to check. `go test -tags integration ./integration/chaos/ -mode share`,
// or TIDEMARK_CHAOS_MODE=share.
var mode = flag.String("mode", envOr("TIDEMARK_CHAOS_MODE", "group"), "group (consumer group) or share (share group)")

// shareLock is the acquisition lock of the share mode's group: shorter
// than pauseFor, so a paused consumer's records go to the others.
const shareLock = 3 * time.Second

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// The kinds of fault.
const (
	faultKill     = "kill9"            // SIGKILL one consumer
	faultTerm     = "sigterm"          // SIGTERM one consumer (graceful stop)
	faultStart    = "start"            // start one more consumer
	faultPause    = "pause"            // SIGSTOP one consumer past its session timeout, then SIGCONT
	faultKafka    = "restart-kafka"    // restart the broker (half of them SIGKILL)
	faultPostgres = "restart-postgres" // restart PostgreSQL (half of them immediate shutdown)
)

// processFaultKinds are the faults on processes and services.
var processFaultKinds = []string{faultKill, faultTerm, faultStart, faultPause, faultKafka, faultPostgres}

// faultKinds are all the kinds, in the summary's order; netfaults_test.go
// has the network faults and the partition increase, brokerfaults_test.go
// those of a cluster's brokers.
var faultKinds = slices.Concat(processFaultKinds, netFaultKinds, brokerFaultKinds)

// faultStats is what the summary says about one kind of fault.
type faultStats struct {
	Count         int     `json:"count"`
	WorstRecovery float64 `json:"worst_recovery_s"`
	MeanRecovery  float64 `json:"mean_recovery_s"`
	// Fenced is the records the victims of the fault counted in
	// tidemark.records.fenced during it (cut-kafka: the zombie's).
	Fenced float64 `json:"fenced,omitempty"`
	total  time.Duration
}

// summary is the JSON written to TIDEMARK_CHAOS_SUMMARY.
type summary struct {
	Mode            string                 `json:"mode"`
	Nodes           int                    `json:"kafka_nodes"`
	Seed            uint64                 `json:"seed"`
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
	FinalCatchUp    float64                `json:"final_catch_up_s"`
	Samples         int                    `json:"offset_samples"`
	SamplesFailed   int                    `json:"offset_samples_failed"`
	Lost            int                    `json:"lost"`
	Duplicated      int                    `json:"duplicated"`
	OrderViolations int                    `json:"key_order_violations"`
	BackwardCommits int                    `json:"backward_commits"`
	DeadLettered    int64                  `json:"dead_lettered"`
	// The network faults (netfaults_test.go).
	FencedLanded      int     `json:"fenced_effects_landed"`
	LeaseEpochs       int     `json:"lease_epochs_seen"`
	PartitionsAtEnd   int     `json:"partitions_at_end"`
	NewPartitionsTook float64 `json:"new_partitions_consumed_s,omitempty"`
	ResetsMidCommit   int     `json:"resets_mid_commit"`
	ResetsMidFetch    int     `json:"resets_mid_fetch"`
	ResetsRandom      int     `json:"resets_random"`
	ResetConns        int     `json:"reset_random_connections"`
	// The failed commits (the runner's "commit failed" log lines: franz-go
	// gave up on the request after its own retries of NOT_COORDINATOR and
	// the like) by the fault during which they were logged and by error.
	CommitFailures map[string]map[string]int `json:"commit_failures"`
	// The OffsetCommit answers on the wire (commitWatch): all of them,
	// the refused ones by fault and error, and those franz-go retried
	// itself after finding the coordinator again.
	CommitsAnswered int                       `json:"commits_answered"`
	CommitsRefused  map[string]map[string]int `json:"commits_refused"`
	CommitsRetried  int                       `json:"commits_retried"`
	// Answers the watch could not decode (its counts miss them).
	CommitsUndecoded    int `json:"commits_undecoded,omitempty"`
	CommitFailuresTotal int `json:"commit_failures_total"`
	FinalCommitFailures int `json:"final_commit_failures"`
	// The broker faults (brokerfaults_test.go): the longest wait after a
	// fault until every partition had its replicas in sync again.
	WorstBackInSync float64 `json:"worst_back_in_sync_s,omitempty"`
	Pass            bool    `json:"pass"`
}

// TestChaos is the chaos suite; the package documentation and
// docs/chaos.md say what it does.
func TestChaos(t *testing.T) {
	began := time.Now()
	if *mode != "group" && *mode != "share" {
		t.Fatalf("-mode / TIDEMARK_CHAOS_MODE %q: want group or share", *mode)
	}
	shared := *mode == "share"
	duration := envDuration(t, "TIDEMARK_CHAOS_DURATION", 75*time.Second)
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
	t.Logf("chaos: %s mode, seed %d (replay with TIDEMARK_CHAOS_SEED=%d), %s of faults, %d orders/s", *mode, seed, seed, duration, rate)

	brokers := bed.Kafka(t)
	tb, tbOut := openBed(t, brokers)
	nodes, err := tb.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	// make soak CLUSTER=3 says how many nodes the run is for: a bed of
	// another size would silently run other faults.
	if want := os.Getenv("TIDEMARK_CHAOS_NODES"); want != "" && want != strconv.Itoa(len(nodes)) {
		t.Fatalf("TIDEMARK_CHAOS_NODES=%s, but the bed in %s has %d Kafka node(s): scripts/testbed down, then TIDEMARK_KAFKA_NODES=%s scripts/testbed up\n%s",
			want, tb.Dir(), len(nodes), want, bed.StartHint)
	}
	cluster := len(nodes) > 1
	if cluster && len(nodes) != replicas {
		t.Fatalf("the broker faults need a cluster of %d nodes (TIDEMARK_KAFKA_NODES=%d scripts/testbed up); this bed has %d", replicas, replicas, len(nodes))
	}
	// restart restarts one service of the bed in this process; the bed's
	// progress lines are shown only when it fails. Kafka's goes through
	// the broker faults (set below), which make the consumers' proxies
	// refuse connections while it is down.
	var bf *brokerFaults
	restart := func(ctx context.Context, svc testbed.Service, m testbed.Mode) error {
		if svc.Kind == testbed.Kafka {
			return bf.restartKafka(ctx, m)
		}
		tbOut.Reset()
		if err := tb.Restart(ctx, svc, m); err != nil {
			return fmt.Errorf("%v\n%s", err, tbOut)
		}
		return nil
	}
	pool := bed.PG(t)
	ctx := context.Background()
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	adm := bed.Admin(t)
	// bed.Topic's replication is the broker's default: on a cluster
	// three replicas with min.insync.replicas 2 (the orders processes
	// create the dead-letter topic with the same default).
	topic, group := bed.Topic(t, partitions), bed.Group(t)
	if cluster {
		wantReplicas(t, adm, topic, replicas)
	}
	dlq := topic + ".dlq"
	t.Cleanup(func() { // registered after the topic's: runs before it
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopic(ctx, dlq)
	})

	// A service restart that fails half-way must not leave the bed down
	// for whatever runs next.
	var restartFailed atomic.Bool
	t.Cleanup(func() {
		if restartFailed.Load() || cluster { // on a cluster, a failed fault may have left a node down or paused
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for _, svc := range []testbed.Service{{Kind: testbed.Kafka}, {Kind: testbed.Postgres}} {
				tbOut.Reset()
				if err := tb.Start(ctx, svc); err != nil {
					t.Logf("cleanup: start %s: %v\n%s", svc, err, tbOut)
				}
			}
			if cluster {
				if err := tb.WaitInSync(ctx, inSyncWithin); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		}
	})

	logDir := logDirectory(t)
	bin := filepath.Join(t.TempDir(), "orders")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/orders").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/orders: %v\n%s", err, out)
	}
	// synchronous_commit=on: the bed turns it off for speed, and then a
	// COMMIT is acknowledged before its WAL is written, so a PostgreSQL
	// crash (restart --kill) loses the last ~200 ms of acknowledged
	// transactions — effects the consumers rightly took as applied and
	// committed past (seed 1795946294864521435 lost 10 that way). A
	// database that forgets commits it acknowledged is outside what the
	// inbox can promise; with the setting per session, a crash of the
	// server process loses nothing (fsync stays off: the OS keeps the
	// written WAL).
	//
	// idle_in_transaction_session_timeout is what docs/inbox.md tells
	// users to set: a frozen consumer's open transaction (and the inbox
	// rows it claimed) is rolled back after 3 s instead of holding its keys
	// until the process wakes.
	svcDSN := serviceDSN(schema, "synchronous_commit=on", "idle_in_transaction_session_timeout=3000")
	// The DSN and -kafka-dial come from fleet.network: each consumer's own
	// proxies.
	args := []string{"-brokers", strings.Join(brokers, ","), "-group", group, "-topic", topic,
		"-dlq", dlq, "-http", "127.0.0.1:0", "-concurrency", "32", "-session-timeout", sessionTimeout.String(),
		"-metadata-max-age", metadataMaxAge.String()}
	if shared {
		args = append(args, "-mode", "share", "-share-lock", shareLock.String())
	}
	fl := newFleet(t, bin, logDir, args, []string{"TIDEMARK_SHUTDOWN_BUDGET=10s"})
	if err := fl.network(kafkaAddresses(t, adm, brokers), svcDSN); err != nil {
		t.Fatal(err)
	}

	// Everything the run starts ends before the test returns.
	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	t.Cleanup(func() { stopRun(); bg.Wait() })

	// The inbox's tables, created here rather than by the first consumer,
	// so that the commit audit is on them before any row is written.
	if !shared {
		store, err := inbox.New(pool, group)
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err == nil {
			err = auditCommits(ctx, pool)
		}
		if err != nil {
			t.Fatalf("the inbox's tables and the commit audit: %v", err)
		}
		if os.Getenv("TIDEMARK_CHAOS_BREAK_FENCE") == "1" {
			if err := breakFence(ctx, pool); err != nil {
				t.Fatal(err)
			}
			t.Logf("chaos: TIDEMARK_CHAOS_BREAK_FENCE=1: the inbox's commit-time fence is off in this run's schema; the run must fail")
		}
	}
	// The monitor's client is its own, for unstick below.
	mcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mcl.Close)
	madm := kadm.NewClient(mcl)
	mon := newMonitor(madm, group, topic, partitions, sampleEvery, shared)
	bg.Add(1)
	go func() { defer bg.Done(); mon.run(runCtx) }()
	var unstuck atomic.Int64
	if cluster {
		bg.Add(1)
		go func() { defer bg.Done(); unstick(runCtx, mcl, mon, group, &unstuck) }()
	}
	lw := newLeases(pool, group, topic, sampleEvery)
	bg.Add(1)
	go func() { defer bg.Done(); lw.run(runCtx) }()
	nf := newNetFaults(fl, mon, madm, topic)
	bf = newBrokerFaults(tb, tbOut, nodes, nodeAddrs(t, adm), fl, mon, nf, topic, group)
	if cluster {
		// A bed just up, or a run before this one, may have left a
		// replica behind: the first fault must not take a second one.
		if _, err := bf.settle(runCtx); err != nil {
			t.Fatalf("before the run: %v", err)
		}
	}

	// Two producers, odd and even order numbers, for the whole fault phase.
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
	t.Logf("chaos: %d consumers committing on all %d partitions after %s", initialProcs, partitions, time.Since(began).Round(time.Millisecond))

	// The fault phase: one fault at a time, each followed by the wait for
	// recovery, then a random pause. Kinds are dealt from shuffled decks so
	// that every kind occurs once in each round; the first round always
	// completes, however short the duration.
	stats := map[string]*faultStats{}
	for _, k := range slices.Concat(processFaultKinds, netFaultKinds, bf.kinds()) {
		stats[k] = &faultStats{}
	}
	var worst time.Duration
	var worstKind string
	var windows []faultWindow
	var deck []string
	faultStart := time.Now()
	round := 0
	for n := 1; ; n++ {
		if len(deck) == 0 {
			if round > 0 && time.Since(faultStart) >= duration {
				break
			}
			round++
			deck = slices.Concat(processFaultKinds, nf.kinds(), bf.kinds())
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			deck = bf.expand(deck)
		}
		if round > 1 && time.Since(faultStart) >= duration && !bf.rollingUnderWay() {
			break
		}
		kind := deck[0]
		deck = deck[1:]
		if f := feasible(kind, fl); f != kind {
			// The zombie is the network fault the suite exists for:
			// put off, not dropped, so that every round has one (seed
			// 1796168489683825264 turned its only one into a start).
			if kind == faultCutKafka {
				deck = append([]string{kind}, deck...)
			}
			kind = f
		}
		before := mon.latest()
		at := time.Now()
		from := at // the fault's window, for its failed commits
		detail, resumed, err := inject(runCtx, &bg, kind, fl, nf, bf, rng, restart, &restartFailed)
		if err != nil {
			t.Fatalf("fault %d (%s): %v; seed %d", n, kind, err, seed)
		}
		if at2, before2, ok := nf.startedAt(); ok {
			at, before = at2, before2
		}
		if at2, before2, ok := bf.startedAt(); ok {
			at, before = at2, before2
		}
		took, stuck, ok := waitRecovered(runCtx, mon, before, at, time.Now(), recoverWithin)
		if resumed != nil {
			if err := <-resumed; err != nil {
				t.Fatalf("fault %d (%s, %s): ending it: %v", n, kind, detail, err)
			}
		}
		if !ok {
			s := mon.latest()
			t.Fatalf("fault %d (%s, %s) at %s: not recovered after %s: partitions %v stuck (committed %v, end %v); consumer logs in %s; seed %d",
				n, kind, detail, at.Format("15:04:05.000"), recoverWithin, stuck, s.committed, s.end, logDir, seed)
		}
		if cluster {
			back, err := bf.settle(runCtx)
			if err != nil {
				t.Fatalf("fault %d (%s, %s): the cluster back in sync: %v; seed %d", n, kind, detail, err, seed)
			}
			detail += fmt.Sprintf(", in sync %s later", back.Round(100*time.Millisecond))
		}
		windows = append(windows, faultWindow{kind: kind, from: from, to: time.Now()})
		st := stats[kind]
		st.Count++
		st.total += took
		fenced := nf.takeFenced(kind)
		st.Fenced += fenced
		if fenced > 0 {
			detail += fmt.Sprintf(", %.0f fenced", fenced)
		}
		if took > time.Duration(st.WorstRecovery*float64(time.Second)) {
			st.WorstRecovery = took.Seconds()
		}
		if took > worst {
			worst, worstKind = took, kind
		}
		t.Logf("chaos: fault %2d at %6.1fs %-16s %-34s recovered in %s (lag %d, %d consumers)",
			n, at.Sub(faultStart).Seconds(), kind, detail, took.Round(10*time.Millisecond), mon.latest().lag(), len(fl.running(false)))
		if u := fl.unexpected(); len(u) > 0 {
			t.Fatalf("a consumer died without being told to: %s; seed %d", strings.Join(u, "; "), seed)
		}
		if !bf.rollingUnderWay() { // a rolling restart's next node follows at once
			sleep(runCtx, time.Duration(500+rng.IntN(2500))*time.Millisecond)
		}
	}
	faultPhase := time.Since(faultStart)

	// The end: producers stop, the consumers catch up, then stop.
	stopProducing()
	prodWG.Wait()
	for range 2 {
		if err := <-prodErr; err != nil {
			t.Fatalf("producer: %v", err)
		}
	}
	if len(fl.running(true)) == 0 {
		if _, err := fl.start(); err != nil {
			t.Fatal(err)
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

	// The checks.
	recs := readBack(t, brokers, topic)
	res := check(t, pool, group, topic, recs, !shared)
	dead := deadLettered(t, dlq)
	backward := mon.backwardCommits()
	ok, failed := mon.counts()
	var landed []string
	if !shared {
		lctx, lcancel := context.WithTimeout(ctx, time.Minute)
		var err error
		landed, err = lw.landedFenced(lctx)
		lcancel()
		if err != nil {
			t.Fatalf("reading the inbox rows' commit times: %v", err)
		}
	}
	epochs, _ := lw.counts()
	commits, final, err := commitFailures(logDir, windows)
	if err != nil {
		t.Error(err)
	}
	if cluster {
		t.Logf("chaos: the monitor's client was made to forget a dead coordinator %d times", unstuck.Load())
	}

	sum := summary{
		Mode: *mode, Seed: seed, FaultPhase: faultPhase.Seconds(), Total: time.Since(began).Seconds(), Partitions: partitions,
		Produced: len(recs), ProduceFailed: prodFailed.Load(), ConsumersRun: fl.started(), Faults: stats,
		WorstRecovery: worst.Seconds(), WorstKind: worstKind, FinalCatchUp: catchUpTook.Seconds(),
		Samples: ok, SamplesFailed: failed, Lost: res.lost, Duplicated: res.duplicated,
		OrderViolations: res.orderViolations, BackwardCommits: len(backward), DeadLettered: dead,
		FencedLanded: len(landed), LeaseEpochs: epochs,
		CommitFailures: commits, FinalCommitFailures: final,
	}
	nf.summarize(&sum)
	bf.summarize(&sum)
	fl.commits.summarize(&sum, windows)
	for _, byErr := range commits {
		for _, c := range byErr {
			sum.CommitFailuresTotal += c
		}
	}
	for _, st := range stats {
		sum.FaultsTotal += st.Count
		if st.Count > 0 {
			st.MeanRecovery = (st.total / time.Duration(st.Count)).Seconds()
		}
	}
	for _, b := range backward {
		t.Errorf("committed offset went backward: %s", b)
	}
	if dead > 0 {
		t.Errorf("%d orders were dead-lettered: no order of this run is malformed", dead)
	}
	if len(landed) > 0 {
		t.Errorf("FENCED OWNER: %d effects committed by an owner whose partition's lease had moved on: %s", len(landed), head(landed))
	}
	if !shared && stats[faultCutKafka].Count > 0 && stats[faultCutKafka].Fenced == 0 {
		t.Errorf("the %d consumers cut off from Kafka counted no fenced record (tidemark.records.fenced): the zombie that keeps writing to PostgreSQL after the group moved its partitions did not happen, so the run did not test its fencing",
			stats[faultCutKafka].Count)
	}
	if st := stats[faultReset]; !shared && st.Count > 0 && (sum.ResetsMidCommit == 0 || sum.ResetsMidFetch == 0) { // a share group commits no offsets
		t.Errorf("the %d reset faults reset %d connections mid-commit and %d mid-fetch: a reset that hit no commit or no fetch did not test what it is for",
			st.Count, sum.ResetsMidCommit, sum.ResetsMidFetch)
	}
	if !shared && sum.CommitsAnswered == 0 {
		t.Errorf("the consumers' proxies read no OffsetCommit answer they could decode (%d undecoded): the commit watch saw nothing, so its counts mean nothing", sum.CommitsUndecoded)
	}
	if final > 0 {
		// A final commit that fails leaves records to be delivered again:
		// allowed (the inbox skips them), worth seeing.
		t.Logf("chaos: %d final commits (of a revoke or a stop) failed", final)
	}
	if prodFailed.Load() > 0 {
		t.Logf("chaos: %d produce requests failed for good (not in the topic, not expected)", prodFailed.Load())
	}
	sum.Pass = !t.Failed()
	report(t, sum)
	reportNet(t, sum)
	if sum.Pass {
		_ = os.RemoveAll(logDir)
	} else {
		t.Logf("chaos: consumer logs kept in %s; replay with TIDEMARK_CHAOS_SEED=%d", logDir, seed)
	}
}

// feasible returns kind, or another kind when kind cannot run now: at least
// two consumers must be consuming before one is killed, stopped or paused,
// and at most maxProcs run at once.
func feasible(kind string, fl *fleet) string {
	active, running := len(fl.running(true)), len(fl.running(false))
	switch kind {
	case faultKill, faultTerm, faultPause, faultCutKafka:
		if active < 2 {
			return faultStart
		}
	case faultCutPG, faultLatency, faultReset:
		if active < 1 {
			return faultStart
		}
	case faultStart:
		if running >= maxProcs {
			return faultTerm
		}
	}
	return kind
}

// inject starts one fault and returns a description. For a pause it returns
// a channel that receives the outcome of the SIGCONT, sent pauseFor later
// (or as soon as ctx ends) by a goroutine counted in bg.
func inject(ctx context.Context, bg *sync.WaitGroup, kind string, fl *fleet, nf *netFaults, bf *brokerFaults, rng *rand.Rand,
	restart func(context.Context, testbed.Service, testbed.Mode) error, restartFailed *atomic.Bool) (string, <-chan error, error) {
	pick := func() *consumer {
		cs := fl.running(true)
		return cs[rng.IntN(len(cs))]
	}
	if nf.handles(kind) {
		return nf.inject(ctx, bg, kind, rng)
	}
	if bf.handles(kind) {
		return bf.inject(ctx, bg, kind, rng)
	}
	switch kind {
	case faultKill:
		c := pick()
		return c.name, nil, fl.signal(c, syscall.SIGKILL)
	case faultTerm:
		c := pick()
		start := time.Now()
		code, err := fl.stop(c, 30*time.Second)
		if err != nil {
			return c.name, nil, err
		}
		// 3 is a drain that ran out of budget: allowed (the next owner
		// replays), and worth seeing in the log.
		if code != 0 && code != 3 {
			return c.name, nil, fmt.Errorf("%s exited %d after SIGTERM, want 0 or 3 (log %s)", c.name, code, c.log)
		}
		return fmt.Sprintf("%s exit %d in %s", c.name, code, time.Since(start).Round(10*time.Millisecond)), nil, nil
	case faultStart:
		c, err := fl.start()
		if err != nil {
			return "", nil, err
		}
		return c.name, nil, nil
	case faultPause:
		c := pick()
		if err := fl.signal(c, syscall.SIGSTOP); err != nil {
			return c.name, nil, err
		}
		resumed := make(chan error, 1)
		bg.Add(1)
		go func() {
			defer bg.Done()
			sleep(ctx, pauseFor)
			resumed <- fl.signal(c, syscall.SIGCONT)
		}()
		return fmt.Sprintf("%s for %s", c.name, pauseFor), resumed, nil
	case faultKafka, faultPostgres:
		svc := testbed.Service{Kind: testbed.Kafka}
		if kind == faultPostgres {
			svc = testbed.Service{Kind: testbed.Postgres}
		}
		mode, how := testbed.Graceful, "graceful"
		if rng.IntN(2) == 0 {
			mode, how = testbed.Crash, "crash"
		}
		start := time.Now()
		restartFailed.Store(true)
		if err := restart(ctx, svc, mode); err != nil {
			return how, nil, fmt.Errorf("restart %s (%s): %w", svc, how, err)
		}
		restartFailed.Store(false)
		return fmt.Sprintf("%s, down+up %s", how, time.Since(start).Round(10*time.Millisecond)), nil, nil
	}
	return "", nil, fmt.Errorf("unknown fault %q", kind)
}

// waitRecovered waits until every partition has recovered (see recovered)
// in a sample taken after the fault was injected (injected: a restart
// returns once the service is back), and returns the time from the fault
// (at) to that sample. A sample taken while a restart was under way does
// not count: a broker's controlled shutdown takes seconds, during which
// the consumers still commit, so that sample could pass and a 38 s
// outage be reported as recovered in 0.8 s (seed 1796168489683825264).
func waitRecovered(ctx context.Context, mon *monitor, before *sample, at, injected time.Time, within time.Duration) (time.Duration, []int32, bool) {
	deadline := time.Now().Add(within)
	var stuck []int32
	for time.Now().Before(deadline) {
		if s := mon.latest(); s != nil && s.at.After(at) && s.at.After(injected) {
			var ok bool
			if ok, stuck = recovered(before, s); ok {
				return s.at.Sub(at), nil, true
			}
		}
		if !sleep(ctx, 50*time.Millisecond) {
			break
		}
	}
	return 0, stuck, false
}

// produce writes orders first, first+step, … at rate per second until ctx
// ends, then flushes. Order i is keyed by its customer, as examples/orders/
// produce writes them. A record that fails for good is counted, not
// retried: the topic read back is the truth the checks use.
func produce(runCtx, ctx context.Context, brokers []string, topic string, first, step, rate int, produced, failed *atomic.Int64) error {
	// A buffer that holds a whole broker restart's worth of records, so
	// Produce does not block while the broker is down.
	// MetadataMaxAge as the consumers': the producers too see added
	// partitions within it, and the default partitioner then sends some
	// customers to them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20), kgo.MetadataMaxAge(metadataMaxAge))
	if err != nil {
		return err
	}
	defer cl.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	i, sent := first, 0
	for ctx.Err() == nil {
		want := int(time.Since(began).Seconds() * float64(rate))
		for ; sent < want && ctx.Err() == nil; sent++ {
			c := fmt.Sprintf("customer-%04d", (i*31)%customers)
			v, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("order-%d", i), "customer": c, "amount_cents": 100 + (i*7919)%10000})
			// runCtx, not ctx: the records buffered when the fault phase
			// ends are still delivered; when the test aborts they fail.
			cl.Produce(runCtx, &kgo.Record{Key: []byte(c), Value: v}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Add(1)
				} else {
					produced.Add(1)
				}
			})
			i += step
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	// The run's ctx, not the producer's: at the end of the fault phase the
	// flush waits for the broker; when the test is aborting it does not.
	fctx, cancel := context.WithTimeout(runCtx, 2*time.Minute)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// serviceDSN is TIDEMARK_PG_DSN with the run's schema as search_path and
// the session settings (name=value) added.
func serviceDSN(schema string, settings ...string) string {
	dsn := os.Getenv("TIDEMARK_PG_DSN")
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + strings.Join(append([]string{"search_path=" + schema}, settings...), "&")
}

// openBed returns the project's test bed (internal/testbed, as
// scripts/testbed runs it) with a buffer that receives its progress lines,
// and fails the test unless both of its servers serve and they are the ones
// TIDEMARK_KAFKA_BROKERS and TIDEMARK_PG_DSN name: the suite restarts them.
func openBed(t *testing.T, brokers []string) (*testbed.Bed, *bytes.Buffer) {
	t.Helper()
	out := &bytes.Buffer{}
	tb, err := testbed.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := tb.Status(ctx)
	if err != nil {
		t.Fatalf("the chaos suite restarts Kafka and PostgreSQL of the project's test bed, whose state it cannot read: %v\n%s", err, bed.StartHint)
	}
	dsn, _, _ := strings.Cut(os.Getenv("TIDEMARK_PG_DSN"), "?")
	bedDSN, _, _ := strings.Cut(s.State.DSN(), "?")
	if s.Code() != 0 || s.State.Brokers() != strings.Join(brokers, ",") || dsn != bedDSN {
		t.Fatalf("the chaos suite restarts Kafka and PostgreSQL of the project's test bed, so it needs that bed serving "+
			"and TIDEMARK_KAFKA_BROKERS (%s) and TIDEMARK_PG_DSN naming it; the bed in %s says:\n%s\n%s",
			strings.Join(brokers, ","), tb.Dir(), strings.Join(s.Lines(), "\n"), bed.StartHint)
	}
	return tb, out
}

// logDirectory is where the consumers' logs go: TIDEMARK_CHAOS_LOGS, or a
// temporary directory removed when the test passes.
func logDirectory(t *testing.T) string {
	if d := os.Getenv("TIDEMARK_CHAOS_LOGS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, err := os.MkdirTemp("", "tidemark-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		t.Fatalf("%s=%q: want a duration such as 90s or 10m", name, s)
	}
	return d
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 2 {
		t.Fatalf("%s=%q: want an integer of at least 2", name, s)
	}
	return n
}

func waitFor(ctx context.Context, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", within)
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
