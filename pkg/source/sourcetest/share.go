package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/pkg/runner"
)

// The share scenarios: what a share-group adapter (Capabilities.Share)
// must do where a group adapter's scenario would read committed offsets.
// A share group commits nothing: each record is acknowledged on its own,
// and "done" is the share group's lag 0 on every partition
// (kafkatest.Cluster.ShareLags). The spy checks, besides the hand-over
// contract, that the runner never commits over the adapter and that it
// settles only records handed over, each at most once per hand-over.

// settled waits until every record of topic is done for the scenario's
// group: committed to the end (a group adapter) or acknowledged (a share
// adapter).
func (e *env) settled(topic string, within time.Duration) {
	e.t.Helper()
	if e.f.Capabilities.Share {
		kafkatest.WaitFor(e.t, within, "the share group's lag 0 on every partition (every record acknowledged)", e.c.ShareAcked(e.group, topic))
		return
	}
	kafkatest.WaitFor(e.t, within, "committed == end offsets (lag 0)", e.c.AtEnd(e.group, topic))
}

// settle is the spy's view of one settlement: a share adapter settles a
// record the runner was handed, once per hand-over.
func (s *spy) settle(tp runner.TP, off int64, st runner.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := recKey{tp, off}
	if s.outstanding[k] <= 0 {
		s.fail("%s@%d settled %s without an unsettled hand-over of it", tp, off, st)
		return
	}
	s.outstanding[k]--
	s.settlements[st]++
}

// recKey is one record: partition and offset.
type recKey struct {
	tp  runner.TP
	off int64
}

// shareStorm: three members, then one joining or leaving about every
// second while 6,000 keyed records arrive in six chunks, and on until
// every record is handled and acknowledged. Checked: every record handled
// at least once, the share group's lag 0 at the end, no record handled by
// two members at once (its acquisition lock), and the spies' contract.
func shareStorm(t *testing.T, f Factory) {
	const records, partitions, keys, steps = 6000, 6, 300, 6
	per := records / steps
	e := newEnv(t, f)
	topic := e.c.Topic(partitions)

	var (
		mu        sync.Mutex
		seen      = make([]bool, records)
		unique    int
		handlings int
		running   = map[int]string{} // record → member running it
		violation string
	)
	handler := func(member string) runner.Handler {
		return func(_ context.Context, rec runner.Record) error {
			i, err := strconv.Atoi(string(rec.Value))
			if err != nil || i < 0 || i >= records {
				return fmt.Errorf("record %s: bad value %q", rec.String(), rec.Value)
			}
			mu.Lock()
			handlings++
			if other, ok := running[i]; ok && violation == "" {
				violation = fmt.Sprintf("%s handled by %s while %s ran it: two members held its acquisition at once", rec.String(), member, other)
			}
			running[i] = member
			if !seen[i] {
				seen[i] = true
				unique++
			}
			mu.Unlock()
			time.Sleep(rand.N(2 * time.Millisecond))
			mu.Lock()
			delete(running, i)
			mu.Unlock()
			return nil
		}
	}
	handled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return unique
	}
	var members []*member
	n, joins, leaves := 0, 0, 0
	add := func() {
		n++
		name := "m" + strconv.Itoa(n)
		members = append(members, e.start(name, []string{topic}, handler(name), memberOpts{runner: []runner.Option{runner.Concurrency(16)}}))
	}
	for range 3 {
		add()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for step := 0; ; step++ {
		if from := step * per; from < records {
			recs := make([]*kgo.Record, 0, per)
			for i := from; i < from+per; i++ {
				k := i % keys
				recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(k % partitions), Key: []byte("key-" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(i))})
			}
			e.c.Produce(recs...)
		} else if u := handled(); u == records {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("only %d of %d records handled after 2m", u, records)
		}
		time.Sleep(700*time.Millisecond + rand.N(500*time.Millisecond))
		if len(members) >= 3 || (len(members) > 1 && rand.IntN(2) == 0) {
			k := rand.IntN(len(members))
			m := members[k]
			members = slices.Delete(members, k, k+1)
			if err := m.stop(); err != nil {
				t.Errorf("member %s: stop: %v", m.name, err)
			}
			m.spy.check(t, m.name)
			leaves++
		} else {
			add()
			joins++
		}
	}
	e.settled(topic, time.Minute)
	for _, m := range members {
		if err := m.stop(); err != nil {
			t.Errorf("member %s: stop: %v", m.name, err)
		}
		m.spy.check(t, m.name)
	}
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Error(violation)
	}
	t.Logf("%d records over %d partitions, %d handlings (%d again: a stopping member releases what it did not finish); %d joins and %d leaves after the first 3 members",
		records, partitions, handlings, handlings-records, joins, leaves)
}

// shareShutdown: partition 0's record at offset 20 blocks until its ctx
// ends. Shutdown cancels it when the drain budget (2s) runs out and
// returns a *runner.DrainError naming it; the record is released, not
// accepted, so a member started afterwards handles it (a second delivery)
// and the share group's lag reaches 0. Every other record is handled
// exactly once.
func shareShutdown(t *testing.T, f Factory) {
	const partitions, per, stuck = 3, 100, 20
	e := newEnv(t, f)
	topic := e.c.Topic(partitions)
	e.c.Produce(kafkatest.Spread(topic, partitions, per, nil)...)

	l := kafkatest.NewLedger()
	var stuckDeliveries []int32
	var mu sync.Mutex
	h := func(ctx context.Context, rec runner.Record) error {
		if rec.Partition == 0 && rec.Offset == stuck {
			mu.Lock()
			stuckDeliveries = append(stuckDeliveries, rec.DeliveryCount)
			first := len(stuckDeliveries) == 1
			mu.Unlock()
			if first {
				<-ctx.Done()
				return ctx.Err()
			}
		}
		return nil
	}
	a := e.start("a", []string{topic}, l.Handler("a", h), memberOpts{runner: []runner.Option{runner.Concurrency(4)}})
	kafkatest.WaitFor(t, 30*time.Second, "every record but the stuck one handled", func() bool {
		return l.Count() == partitions*per
	})
	err := a.drainWithin(2*time.Second, 30*time.Second)
	var de *runner.DrainError
	switch {
	case !errors.As(err, &de):
		t.Errorf("Shutdown returned %v, want a *runner.DrainError for the stuck record", err)
	case len(de.Unfinished) != 1 || de.Unfinished[tpOf(topic, 0)] != stuck:
		t.Errorf("Shutdown reported unfinished %v, want only %s at %d", de.Unfinished, tpOf(topic, 0), stuck)
	}
	a.spy.check(t, "a")

	b := e.start("b", []string{topic}, l.Handler("b", h), memberOpts{})
	e.settled(topic, time.Minute)
	if err := b.stop(); err != nil {
		t.Errorf("member b: stop: %v", err)
	}
	b.spy.check(t, "b")
	for p := range int32(partitions) {
		for off := range int64(per) {
			by := l.HandledBy(tpOf(topic, p), off)
			want := []string{"a"}
			if p == 0 && off == stuck {
				want = []string{"a", "b"}
			}
			if !slices.Equal(by, want) {
				t.Errorf("%s@%d handled by %v, want %v", tpOf(topic, p), off, by, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(stuckDeliveries, []int32{1, 2}) {
		t.Errorf("the stuck record was delivered with counts %v, want [1 2]: released once by the shutdown, then handled", stuckDeliveries)
	}
}

// shareCapability checks the Share capability. Two members of one group
// on a one-partition topic with handlers of 5ms. Present: both members
// handle records of the partition, and their handlers overlap in time (a
// share group has no partition owner). Absent: every record is handled by
// one member at a time (the partition's owner; a rebalance may move it),
// exactly once.
func shareCapability(t *testing.T, f Factory) {
	// More than one member's sessions acquire at once (franz-go's share
	// polls take up to 500 records each), so both get some.
	const records = 3000
	e := newEnv(t, f)
	topic := e.c.Topic(1)
	var (
		mu      sync.Mutex
		running = map[string]int{}
		overlap bool
	)
	h := func(name string) runner.Handler {
		return func(context.Context, runner.Record) error {
			mu.Lock()
			running[name]++
			for other, n := range running {
				if other != name && n > 0 {
					overlap = true
				}
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			running[name]--
			mu.Unlock()
			return nil
		}
	}
	l := kafkatest.NewLedger()
	two := memberOpts{runner: []runner.Option{runner.Concurrency(2)}}
	a := e.start("a", []string{topic}, l.Handler("a", h("a")), two)
	b := e.start("b", []string{topic}, l.Handler("b", h("b")), two)
	// Both members in the group before the records come: a share group
	// gives the partition to both; a consumer group to one of them.
	kafkatest.WaitFor(t, 30*time.Second, "both members in the group, the partition assigned", func() bool {
		if f.Capabilities.Share {
			// A share source reports joining the group with an empty
			// assignment, and each partition when its first records
			// come.
			return len(a.spy.eventsSince(time.Time{})) > 0 && len(b.spy.eventsSince(time.Time{})) > 0
		}
		return a.spy.ownedCount()+b.spy.ownedCount() == 1
	})
	e.c.Produce(kafkatest.Spread(topic, 1, records, nil)...)
	e.settled(topic, time.Minute)
	for _, m := range []*member{a, b} {
		if err := m.stop(); err != nil {
			t.Errorf("member %s: stop: %v", m.name, err)
		}
		m.spy.check(t, m.name)
	}
	ca, cb := l.CountBy("a"), l.CountBy("b")
	mu.Lock()
	defer mu.Unlock()
	if f.Capabilities.Share {
		if ca == 0 || cb == 0 || !overlap {
			t.Errorf("share: members handled %d and %d records of the one partition, overlapping %v; want both, at the same time", ca, cb, overlap)
		}
		t.Logf("capability share: present; two members handled %d and %d records of one partition at the same time", ca, cb)
		return
	}
	if overlap {
		t.Errorf("group: the two members ran handlers of the one partition at the same time (they handled %d and %d records): it had two owners", ca, cb)
	}
	if err := l.ExactlyOnce(topic, kafkatest.Uniform(1, records)); err != nil {
		t.Errorf("group: %v", err)
	}
	t.Logf("capability share: absent; checked: the partition had one owner at a time (the members handled %d and %d records, each once)", ca, cb)
}
