//go:build integration

package chaos_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// The network faults, through each consumer's own proxies (fleet.network),
// and the partition increase.
const (
	faultCutKafka   = "cut-kafka"      // partition one consumer from Kafka (it keeps PostgreSQL) past its session timeout
	faultCutPG      = "cut-postgres"   // partition one consumer from PostgreSQL (it keeps Kafka)
	faultLatency    = "kafka-latency"  // 200 ms each way on one consumer's broker links
	faultReset      = "reset"          // RST one consumer's broker connections mid-fetch, mid-commit and at random
	faultPartitions = "add-partitions" // add partitions to the topic while consuming (once per run)
)

var netFaultKinds = []string{faultCutKafka, faultCutPG, faultLatency, faultReset, faultPartitions}

const (
	// A zombie: the consumer cut off from Kafka is slowed down first (its
	// database link gets zombieDBLatency each way for zombieSlowFor), so
	// that it has a backlog of records in flight when the group moves its
	// partitions; a consumer that keeps up would finish its few buffered
	// records within milliseconds of the cut and have nothing left to
	// fence. It stays cut for kafkaCutFor, past its session timeout.
	zombieDBLatency = 50 * time.Millisecond
	zombieSlowFor   = 3 * time.Second
	kafkaCutFor     = sessionTimeout + 4*time.Second
	pgCutFor        = 5 * time.Second // past idle_in_transaction_session_timeout (3 s)
	brokerLatency   = 200 * time.Millisecond
	latencyFor      = 8 * time.Second
	resetFor        = 6 * time.Second
	resetsEach      = 3 // mid-commit and mid-fetch resets per reset fault

	// metadataMaxAge is the consumers' kgo.MetadataMaxAge
	// (-metadata-max-age; franz-go's default is 5 minutes, its minimum the
	// MetadataMinAge of 5 s): the group leader sees added partitions at
	// its next metadata refresh, at most this long after they were
	// created, and rejoins so that the group assigns them.
	metadataMaxAge = 5 * time.Second
	// newPartitionSlack is what may follow the refresh before a new
	// partition's first commit: the rebalance (the members learn of it at
	// their next heartbeat, 1 s), the lease bump, the fetch, the commit
	// interval (1 s) and the monitor's sampling (250 ms).
	newPartitionSlack = 10 * time.Second
	addPartitions     = 4
)

// netFaults injects the network faults and the partition increase, and
// keeps what the summary reports of them.
type netFaults struct {
	fl    *fleet
	mon   *monitor
	adm   *kadm.Client
	topic string

	mu            sync.Mutex
	added         bool
	newPartsTook  time.Duration
	fenced        map[string]float64 // per fault kind: records the victims counted fenced (tidemark.records.fenced)
	resetsCommit  int
	resetsFetch   int
	resetsRandom  int
	resetConns    int
	partitionsNow int
	// Where a fault's recovery is measured from, when not from its
	// injection (see startedAt).
	start       time.Time
	startSample *sample
}

// startedAt returns, for the fault just injected, the time and the sample
// that its recovery is measured from, when that is not the injection and
// the last sample before it: a cut from Kafka is measured from the cut,
// not from the slowing down before it (during which the victim still
// commits, so that the first sample after the cut could already look
// recovered); a cut from PostgreSQL against the sample when it healed.
func (n *netFaults) startedAt() (time.Time, *sample, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	at, s := n.start, n.startSample
	n.start, n.startSample = time.Time{}, nil
	return at, s, s != nil
}

func newNetFaults(fl *fleet, mon *monitor, adm *kadm.Client, topic string) *netFaults {
	return &netFaults{fl: fl, mon: mon, adm: adm, topic: topic, fenced: map[string]float64{}, partitionsNow: partitions}
}

// kinds returns the kinds for a new round of faults: the partition
// increase only once per run (a topic cannot shrink back).
func (n *netFaults) kinds() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.added {
		return netFaultKinds[:len(netFaultKinds)-1]
	}
	return netFaultKinds
}

// handles reports whether kind is one of n's.
func (n *netFaults) handles(kind string) bool { return slices.Contains(netFaultKinds, kind) }

// Kafka request API keys (the first two bytes after a request's size).
const (
	apiFetch        = 1
	apiOffsetCommit = 8
)

// kafkaRequest returns the API key of the Kafka request b starts with, if
// it looks like the start of one (a positive size, a known key range).
func kafkaRequest(b []byte) (int16, bool) {
	if len(b) < 8 {
		return 0, false
	}
	size := int32(binary.BigEndian.Uint32(b))
	key := int16(binary.BigEndian.Uint16(b[4:]))
	return key, size > 0 && size < 1<<28 && key >= 0 && key < 100
}

// inject starts one fault of n's kinds on a consumer that owns partitions
// and returns a description; a fault that lasts (a cut, a latency) returns
// a channel that receives the outcome of its end, sent by a goroutine
// counted in bg once the fault has lasted its time (or ctx ended).
func (n *netFaults) inject(ctx context.Context, bg *sync.WaitGroup, kind string, rng *rand.Rand) (string, <-chan error, error) {
	if kind == faultPartitions {
		return n.addPartitions(ctx)
	}
	c, err := n.pickOwner(ctx, rng)
	if err != nil {
		return "", nil, err
	}
	if len(c.kafka) == 0 || c.pg == nil {
		return c.name, nil, fmt.Errorf("%s has no proxies: the fleet was not given its network", c.name)
	}
	c.setFaulted(true)
	ended := make(chan error, 1)
	later := func(d time.Duration, end func() error) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			sleep(ctx, d)
			err := end()
			c.setFaulted(false)
			ended <- err
		}()
	}
	switch kind {
	case faultCutKafka:
		before, err := c.metric(ctx, "tidemark_records_fenced_total")
		if err != nil {
			c.setFaulted(false)
			return c.name, nil, err
		}
		c.pg.SetLatency(zombieDBLatency)
		sleep(ctx, zombieSlowFor)
		n.mu.Lock()
		n.startSample = n.mon.latest()
		n.start = time.Now()
		n.mu.Unlock()
		for _, p := range c.kafka {
			p.Blackhole()
		}
		later(kafkaCutFor, func() error {
			for _, p := range c.kafka {
				if err := p.Restore(); err != nil {
					return err
				}
			}
			c.pg.SetLatency(0)
			// The fenced records are counted as they happen, while cut;
			// after the cut the member learns it is out of the group and
			// its partitions' handlers are cancelled.
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			after, err := c.metric(cctx, "tidemark_records_fenced_total")
			if err != nil {
				return err
			}
			n.mu.Lock()
			n.fenced[kind] += after - before
			n.mu.Unlock()
			return nil
		})
		return fmt.Sprintf("%s slowed %s, cut %s", c.name, zombieSlowFor, kafkaCutFor), ended, nil
	case faultCutPG:
		// Nobody takes the victim's partitions over: they stall for the
		// whole cut. Its recovery is measured from the cut against the end
		// offsets when the link healed, so that it counts the outage
		// (measured against the end offsets before the cut, the first
		// commit after it would do: the records it applied just before).
		cutAt := time.Now()
		c.pg.Blackhole()
		sleep(ctx, pgCutFor)
		err := c.pg.Restore()
		c.setFaulted(false)
		n.mu.Lock()
		n.start, n.startSample = cutAt, n.mon.latest()
		n.mu.Unlock()
		return fmt.Sprintf("%s for %s", c.name, pgCutFor), nil, err
	case faultLatency:
		for _, p := range c.kafka {
			p.SetLatency(brokerLatency)
		}
		later(latencyFor, func() error {
			for _, p := range c.kafka {
				p.SetLatency(0)
			}
			return nil
		})
		return fmt.Sprintf("%s %s each way for %s", c.name, brokerLatency, latencyFor), ended, nil
	case faultReset:
		// Right after an OffsetCommit reached the broker (its answer is
		// lost: the commit's outcome is unknown to the member) and right
		// after a Fetch did (mid-fetch: the broker holds a fetch until it
		// has records or FetchMaxWait passed); and at random moments.
		var commits, fetches atomic.Int32
		match := func(toTarget bool, b []byte) bool {
			key, ok := kafkaRequest(b)
			switch {
			case !toTarget || !ok:
				return false
			case key == apiOffsetCommit:
				return commits.Add(1) <= resetsEach
			case key == apiFetch:
				return fetches.Add(1) <= resetsEach
			}
			return false
		}
		for _, p := range c.kafka {
			p.ResetAfter(match)
		}
		randoms := 1 + rng.IntN(3)
		at := make([]time.Duration, randoms)
		for i := range at {
			at[i] = time.Duration(rng.Int64N(int64(resetFor)))
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			start := time.Now()
			conns := 0
			slices.Sort(at)
			for _, d := range at {
				if !sleep(ctx, d-time.Since(start)) {
					break
				}
				for _, p := range c.kafka {
					conns += p.Reset()
				}
			}
			sleep(ctx, resetFor-time.Since(start))
			for _, p := range c.kafka {
				p.ResetAfter(nil)
			}
			c.setFaulted(false)
			n.mu.Lock()
			n.resetsCommit += int(min(commits.Load(), resetsEach))
			n.resetsFetch += int(min(fetches.Load(), resetsEach))
			n.resetsRandom += randoms
			n.resetConns += conns
			n.mu.Unlock()
			ended <- nil
		}()
		return fmt.Sprintf("%s for %s (%d at random)", c.name, resetFor, randoms), ended, nil
	}
	c.setFaulted(false)
	return "", nil, fmt.Errorf("unknown fault %q", kind)
}

// pickOwner returns a random active consumer that owns partitions now
// (its tidemark.partitions.owned): one that owns none — it has just
// rejoined after a pause, say — would make a network fault test nothing
// (seed 1796168140854064870 cut such a zombie off: nothing to fence). It
// waits up to 15 s for one.
func (n *netFaults) pickOwner(ctx context.Context, rng *rand.Rand) (*consumer, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var owners []*consumer
		for _, c := range n.fl.running(true) {
			if v, err := c.metric(ctx, "tidemark_partitions_owned"); err == nil && v >= 1 {
				owners = append(owners, c)
			}
		}
		if len(owners) > 0 {
			return owners[rng.IntN(len(owners))], nil
		}
		if time.Now().After(deadline) || !sleep(ctx, 250*time.Millisecond) {
			return nil, fmt.Errorf("no active consumer owned a partition (tidemark.partitions.owned) for 15 s")
		}
	}
}

// takeFenced returns the fenced records counted for the fault of kind that
// just ended, and forgets them.
func (n *netFaults) takeFenced(kind string) float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.fenced[kind]
	delete(n.fenced, kind)
	return f
}

// summarize adds what n kept to the summary.
func (n *netFaults) summarize(s *summary) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s.PartitionsAtEnd = n.partitionsNow
	s.NewPartitionsTook = n.newPartsTook.Seconds()
	s.ResetsMidCommit, s.ResetsMidFetch, s.ResetsRandom, s.ResetConns = n.resetsCommit, n.resetsFetch, n.resetsRandom, n.resetConns
}

// reportNet logs what the summary says of the network faults.
func reportNet(t *testing.T, s summary) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary, network faults\n")
	if s.Mode == "share" {
		fmt.Fprintf(&b, "  zombies cut from Kafka  %d (no leases in a share group: fencing not checked)\n", s.Faults[faultCutKafka].Count)
	} else {
		fmt.Fprintf(&b, "  zombies cut from Kafka  %d, records they counted fenced %.0f, fenced effects that landed %d (%d lease epochs seen)\n",
			s.Faults[faultCutKafka].Count, s.Faults[faultCutKafka].Fenced, s.FencedLanded, s.LeaseEpochs)
	}
	fmt.Fprintf(&b, "  resets                  %d mid-commit, %d mid-fetch, %d at random (%d connections)\n",
		s.ResetsMidCommit, s.ResetsMidFetch, s.ResetsRandom, s.ResetConns)
	if s.NewPartitionsTook > 0 {
		fmt.Fprintf(&b, "  partitions              %d→%d, the new ones committed %.1fs after their creation (kgo.MetadataMaxAge %s, bound %s)",
			partitions, s.PartitionsAtEnd, s.NewPartitionsTook, metadataMaxAge, metadataMaxAge+newPartitionSlack)
	} else {
		fmt.Fprintf(&b, "  partitions              %d, none added", s.PartitionsAtEnd)
	}
	t.Log(b.String())
}

// kafkaAddresses returns the addresses a consumer's client dials: the seeds
// and every broker's advertised address (from the cluster's metadata).
func kafkaAddresses(t *testing.T, adm *kadm.Client, seeds []string) []string {
	t.Helper()
	set := map[string]bool{}
	for _, a := range seeds {
		set[a] = true
	}
	for _, a := range nodeAddrs(t, adm) {
		set[a] = true
	}
	out := make([]string, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// addPartitions adds partitions to the topic and waits until the group has
// committed on every new one, which must happen within the consumers'
// metadata refresh interval plus the rebalance that follows
// (metadataMaxAge + newPartitionSlack); it fails otherwise.
func (n *netFaults) addPartitions(ctx context.Context) (string, <-chan error, error) {
	n.mu.Lock()
	old := n.partitionsNow
	n.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := n.adm.CreatePartitions(cctx, addPartitions, n.topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return "", nil, fmt.Errorf("adding %d partitions to %s: %w", addPartitions, n.topic, err)
	}
	created := time.Now()
	total := old + addPartitions
	n.mu.Lock()
	n.added, n.partitionsNow = true, total
	n.mu.Unlock()
	bound := metadataMaxAge + newPartitionSlack
	err = waitFor(ctx, bound, func() bool {
		s := n.mon.latest()
		if s == nil || !s.at.After(created) || len(s.end) < total {
			return false
		}
		for p := int32(old); p < int32(total); p++ {
			if s.committed[p] <= 0 {
				return false
			}
		}
		return true
	})
	took := time.Since(created)
	if err != nil {
		s := n.mon.latest()
		return "", nil, fmt.Errorf("partitions %d–%d not all consumed (committed) within %s of their creation (kgo.MetadataMaxAge %s + %s for the rebalance): committed %v, end %v",
			old, total-1, bound, metadataMaxAge, newPartitionSlack, s.committed, s.end)
	}
	n.mu.Lock()
	n.newPartsTook = took
	n.mu.Unlock()
	return fmt.Sprintf("%d→%d, new ones committed in %s", old, total, took.Round(10*time.Millisecond)), nil, nil
}
