package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestParseSessionsPoll(t *testing.T) {
	got, err := parseSessionsPoll("-x", " 4x512, 2x8,4x512")
	if err != nil {
		t.Fatal(err)
	}
	if want := []sessionsPoll{{4, 512}, {2, 8}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v (duplicates dropped)", got, want)
	}
	if s := sessionsPollText(got); s != "4x512,2x8" {
		t.Fatalf("text %q", s)
	}
	back, err := parseSessionsPoll("-x", sessionsPollText(got))
	if err != nil || !reflect.DeepEqual(back, got) {
		t.Fatalf("round trip: %v, %v", back, err)
	}
	for _, bad := range []string{"", "4", "4x", "x8", "0x8", "4x0", "-1x8", "4x8x1", "4X8", "a x b"} {
		_, err := parseSessionsPoll("-share-queue-configs", bad)
		if err == nil || !strings.Contains(err.Error(), "-share-queue-configs") {
			t.Errorf("%q: err %v, want one naming the flag", bad, err)
		}
	}
}

func TestParseShareFlags(t *testing.T) {
	c, err := parseFlags([]string{"-brokers", "b:1", "-workload", "share", "-share-sessions", "1,16", "-share-processes", "1,3",
		"-share-queue-configs", "1x8", "-share-queue-sleep", "20ms"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.workloads, []string{"share"}) || !reflect.DeepEqual(c.shareSessions, []int{1, 16}) ||
		!reflect.DeepEqual(c.shareProcs, []int{1, 3}) || !reflect.DeepEqual(c.shareQConfigs, []sessionsPoll{{1, 8}}) ||
		c.shareQSleep != 20*time.Millisecond {
		t.Fatalf("parsed %+v", c)
	}
	all, err := parseFlags([]string{"-brokers", "b:1", "-workload", "all", "-dsn", "x"})
	if err != nil || !strings.Contains(strings.Join(all.workloads, ","), "share") {
		t.Fatalf("all = %v (%v), want share in it", all.workloads, err)
	}
	for _, args := range [][]string{
		{"-share-processes", "0"},
		{"-share-sessions", "1,x"},
		{"-share-queue-configs", "4"},
		{"-share-queue-sleep", "0s"},
		{"-share-queue-concurrency", "0"},
		{"-share-queue-records", "-1"},
		{"-share-records", "0"},
	} {
		if _, err := parseFlags(append([]string{"-brokers", "b:1", "-workload", "share"}, args...)); err == nil ||
			!strings.Contains(err.Error(), strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%v: err %v, want one naming %s", args, err, args[0])
		}
	}
}

func TestCombine(t *testing.T) {
	sec := int64(time.Second)
	results := []childResult{
		{Records: 100, FirstNS: 10 * sec, EndNS: 14 * sec, Redelivered: 2,
			Seen: []partitionRanges{pr(0, 0, 99)}, Again: []partitionRanges{pr(0, 50, 50)}},
		{Records: 80, FirstNS: 11 * sec, EndNS: 15 * sec, Redelivered: 1,
			Seen: []partitionRanges{pr(0, 90, 179)}},
	}
	r, err := combine(results, []usage{{PeakRSSMiB: 30, CPUSeconds: 1.5}, {PeakRSSMiB: 40, CPUSeconds: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	// 180 records over the union of the windows, 10 s to 15 s; offsets
	// 0–179 handled, 90–99 by both and 50 twice by the first.
	want := shareRun{perProcess: []int{100, 80}, records: 180, seconds: 5, handled: 180, more: 11, redelivered: 3, cpu: 2, rss: 40}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("combine = %+v, want %+v", r, want)
	}
	if r.rate() != 36 {
		t.Fatalf("rate %v", r.rate())
	}
	for name, bad := range map[string][]childResult{
		"no window":   {{Records: 1}},
		"end < first": {{Records: 1, FirstNS: 5, EndNS: 4}},
		"outside":     {{Records: 1, FirstNS: 1, EndNS: 2, Outside: 3}},
		"bad ranges":  {{Records: 1, FirstNS: 1, EndNS: 2, Seen: []partitionRanges{pr(0, 3, 1)}}},
		"no process":  nil,
	} {
		if _, err := combine(bad, nil); err == nil {
			t.Errorf("%s: combine accepted %+v", name, bad)
		}
	}
}

func TestShareRowAndRatio(t *testing.T) {
	sc := shareCase{name: "q", handler: "sleep", sleep: 50 * time.Millisecond, partitions: 1}
	spec := childSpec{Adapter: "share", Concurrency: 8, ShareSessions: 2, SharePoll: 8}
	own := []shareRun{{records: 600, seconds: 2, handled: 600, more: 1, redelivered: 2, cpu: 1, rss: 30},
		{records: 500, seconds: 2, handled: 500, cpu: 3, rss: 20},
		{records: 700, seconds: 2, handled: 700, cpu: 2, rss: 25}}
	base := []shareRun{{records: 300, seconds: 2}, {records: 100, seconds: 2}, {records: 350, seconds: 2}}
	row := shareRowOf(sc, spec, 4, own)
	row.against("group", own, base)
	if row.PerSecond != 300 || row.Theoretical != 640 || math.Abs(row.OfTheory-300.0/640) > 1e-9 {
		t.Fatalf("rate %v, theory %v (%v)", row.PerSecond, row.Theoretical, row.OfTheory)
	}
	if row.Handled != 1800 || row.HandledMore != 1 || row.Redelivered != 2 || row.CPUSeconds != 2 || row.PeakRSSMiB != 30 {
		t.Fatalf("sums %+v", row)
	}
	// Paired: 2, 5, 2 → median 2, not 300/150.
	if row.Baseline != "group" || row.Ratio != 2 || !reflect.DeepEqual(row.RatioRuns, []float64{2, 5, 2}) {
		t.Fatalf("ratio %v %v", row.Ratio, row.RatioRuns)
	}
	row.PerProcess = [][]int{{5, 9}, {0, 7}}
	if lo, hi := row.processSpread(); lo != 0 || hi != 9 {
		t.Fatalf("spread %d–%d, want 0–9", lo, hi)
	}
	if lo, hi := (ShareRow{}).processSpread(); lo != 0 || hi != 0 {
		t.Fatalf("spread of nothing %d–%d", lo, hi)
	}
	noop := shareRowOf(shareCase{handler: "noop"}, childSpec{Adapter: "franz", Concurrency: 256}, 1, own[:1])
	if noop.Theoretical != 0 || noop.Sessions != 0 {
		t.Fatalf("no-op row %+v: no theory, no sessions for the group source", noop)
	}
	var none ShareRow
	none.against("group", own, []shareRun{{}, {}, {}})
	if none.Baseline != "" || none.Ratio != 0 {
		t.Fatalf("a zero baseline must leave no ratio: %+v", none)
	}
}

// TestGate checks that a gated meter's handlers wait for the harness's go,
// and an ungated one's do not.
func TestGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMeter(childSpec{Gated: true})
		m.readyOnce.Do(func() {}) // no ready line on the test's stdout
		pr, pw := io.Pipe()
		go m.awaitGo(pr)
		passed := make(chan struct{})
		go func() { m.gate(context.Background()); close(passed) }()
		synctest.Wait()
		select {
		case <-passed:
			t.Fatal("the gate opened before go")
		default:
		}
		io.WriteString(pw, "ready?\n") // not go
		synctest.Wait()
		select {
		case <-passed:
			t.Fatal("the gate opened on another line")
		default:
		}
		if m.started.Load() {
			t.Fatal("the window started before go")
		}
		io.WriteString(pw, goLine+"\n")
		synctest.Wait()
		select {
		case <-passed:
		default:
			t.Fatal("the gate stayed shut after go")
		}
		if !m.started.Load() {
			t.Fatal("go did not start the window: a process that gets no record would never end")
		}
		pw.Close()
		newMeter(childSpec{}).gate(context.Background()) // returns at once
	})
}

// TestAwaitReady checks that the go comes once all are ready, in any order,
// or the wait after the first; a process that never has a record (another
// holds them all) must not hold the others' gate shut.
func TestAwaitReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		readies := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
		done := make(chan struct{})
		missing := -1
		go func() {
			awaitReady(context.Background(), readies, 10*time.Second, func(n int) { missing = n })
			close(done)
		}()
		close(readies[2]) // the last one first
		close(readies[1])
		time.Sleep(9 * time.Second)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("go before the wait was over, with one process not ready")
		default:
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("no go 11 s after the first was ready, one process never ready")
		}
		if missing != 1 {
			t.Fatalf("late(%d), want late(1)", missing)
		}

		all := []chan struct{}{make(chan struct{}), make(chan struct{})}
		close(all[1])
		close(all[0])
		start := time.Now()
		awaitReady(context.Background(), all, time.Hour, func(int) { t.Error("late called with every process ready") })
		if d := time.Since(start); d != 0 {
			t.Fatalf("go after %v with every process ready", d)
		}
	})
}

// TestShareGoalsAndBareRatio checks the share source's ratios against the
// plain share loop (no-op) and the group source (sleep), and the goals made
// of them.
func TestShareGoalsAndBareRatio(t *testing.T) {
	own := []shareRun{{records: 400, seconds: 2}, {records: 900, seconds: 3}, {records: 160, seconds: 1}}
	bare := []shareRun{{records: 1000, seconds: 2}, {records: 1000, seconds: 2}, {records: 200, seconds: 1}}
	noop := shareRowOf(shareCase{name: "n", handler: "noop"}, childSpec{Adapter: "share", Concurrency: 256, ShareSessions: 4, SharePoll: 512}, 1, own)
	noop.against("group", own, bare)
	noop.againstBare("loop", own, bare)
	// Paired: 0.4, 0.6, 0.8 → 0.6.
	if noop.BareBaseline != "loop" || math.Abs(noop.BareRatio-0.6) > 1e-9 || len(noop.BareRatioRuns) != 3 {
		t.Fatalf("bare ratio %v %v", noop.BareRatio, noop.BareRatioRuns)
	}
	g, ok := noop.goal()
	if !ok || g.Baseline != "loop" || g.Target != shareNoopTarget || g.Met || math.Abs(g.Ratio-0.6) > 1e-9 {
		t.Fatalf("no-op goal %+v (%v): against the loop, 0.6 < 0.8", g, ok)
	}
	sleep := shareRowOf(shareCase{name: "s", handler: "sleep", sleep: 5 * time.Millisecond}, childSpec{Adapter: "share", Concurrency: 256, ShareSessions: 4}, 1, own)
	sleep.against("group", own, []shareRun{{records: 400, seconds: 2}, {records: 900, seconds: 3}, {records: 200, seconds: 1}})
	sleep.againstBare("loop", own, bare) // no effect on the sleep goal
	g, ok = sleep.goal()
	if !ok || g.Baseline != "group" || g.Target != shareSleepTarget || !g.Met || g.Ratio != 1 {
		t.Fatalf("sleep goal %+v (%v): against the group source, 1 ≥ 0.9", g, ok)
	}
	if _, ok := (ShareRow{Handler: "noop", Baseline: "group"}).goal(); ok {
		t.Fatal("a no-op row without the loop's ratio has no goal")
	}
	if r := (shareRun{records: 500, windowCPU: 0.001}); math.Abs(r.cpuPerRecord()-2) > 1e-9 {
		t.Fatalf("%v µs/record, want 2", r.cpuPerRecord())
	}
	if l := shareLabel(childSpec{Consumer: shareLoop, SharePoll: 512, ShareStrict: true}, 1); !strings.Contains(l, "strict") {
		t.Fatalf("label %q", l)
	}
	var b strings.Builder
	printShare(&b, &ShareReport{Repeat: 3, Rows: []ShareRow{noop, sleep}, Goals: []ShareGoal{g}})
	if !strings.Contains(b.String(), "0.60× (0.40 0.60 0.80)") || !strings.Contains(b.String(), "goal ≥ 0.90×: met") {
		t.Fatalf("table:\n%s", b.String())
	}
}

// TestShareLoopDrains runs the plain share loop on kfake: a fresh share
// group reads the topic from its start (the loop sets
// share.auto.offset.reset=earliest), every offset once, at franz-go's
// defaults and strict.
func TestShareLoopDrains(t *testing.T) {
	const topic, parts, n = "t", 3, 3000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte("v")}
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for i, strict := range []bool{false, true} {
		spec := childSpec{Consumer: shareLoop, Brokers: c.ListenAddrs(), Topic: topic, Group: fmt.Sprintf("g%d", i),
			Records: n, Partitions: parts, TrackOffsets: n, SharePoll: 100, ShareStrict: strict}
		m := newMeter(spec)
		if err := runShareLoop(ctx, spec, m); err != nil {
			t.Fatalf("strict %v: %v", strict, err)
		}
		res := m.result()
		handled, more, err := multiplicity(res.Seen, res.Again)
		if err != nil || res.Records != n || handled != n || more != 0 || res.Outside != 0 || res.FirstNS == 0 {
			t.Fatalf("strict %v: %d records, %d handled, %d more than once, %d outside (%v), window from %d", strict,
				res.Records, handled, more, res.Outside, err, res.FirstNS)
		}
	}
}
