//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// sample is one reading of the group's committed offsets and the topic's end
// offsets, per partition. Over a share group, which commits nothing,
// committed is the end offset less the share-partition lag (the records
// from the share-partition start offset to the end not yet acknowledged):
// it reaches the end when every record is acknowledged, and it is not
// monotonic (a released record raises the lag again), so it is not checked
// for going backward.
type sample struct {
	at        time.Time
	committed map[int32]int64 // -1: nothing committed
	end       map[int32]int64
}

// monitor samples the group's committed offsets and the topic's end offsets
// every interval for the whole run, and checks on each reading that no
// partition's committed offset is below the highest one seen before.
type monitor struct {
	adm          *kadm.Client
	group, topic string
	partitions   int
	interval     time.Duration
	share        bool

	mu       sync.Mutex
	last     *sample
	highest  map[int32]int64
	samples  int
	failed   int
	backward []string
}

func newMonitor(adm *kadm.Client, group, topic string, partitions int, interval time.Duration, share bool) *monitor {
	return &monitor{adm: adm, group: group, topic: topic, partitions: partitions, interval: interval, share: share,
		highest: make(map[int32]int64)}
}

// run samples until ctx ends.
func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once takes one sample; a failed reading (the broker restarting) is
// counted and skipped.
func (m *monitor) once(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := m.read(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.failed++
		return
	}
	m.samples++
	for p, c := range s.committed {
		if m.share {
			break
		}
		if h, ok := m.highest[p]; ok && c < h {
			m.backward = append(m.backward, fmt.Sprintf("%s partition %d: committed %d after %d",
				s.at.Format("15:04:05.000"), p, c, h))
			continue
		}
		if c >= 0 {
			m.highest[p] = c
		}
	}
	m.last = s
}

func (m *monitor) read(ctx context.Context) (*sample, error) {
	if m.share {
		return m.readShare(ctx)
	}
	// Committed first, end offsets second: a committed offset is then never
	// above the end offset of the same sample.
	at := time.Now()
	resp, err := m.adm.FetchOffsets(ctx, m.group)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, err
	}
	ends, err := m.adm.ListEndOffsets(ctx, m.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	s := &sample{at: at, committed: make(map[int32]int64, m.partitions), end: make(map[int32]int64, m.partitions)}
	for p := range int32(m.partitions) {
		s.committed[p] = -1
		if o, ok := resp.Lookup(m.topic, p); ok {
			s.committed[p] = o.At
		}
		o, ok := ends.Lookup(m.topic, p)
		if !ok {
			return nil, fmt.Errorf("no end offset for partition %d", p)
		}
		s.end[p] = o.Offset
	}
	return s, nil
}

// latest returns the newest sample, nil before the first.
func (m *monitor) latest() *sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// backwardCommits returns every committed offset seen below an earlier one.
func (m *monitor) backwardCommits() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.backward...)
}

func (m *monitor) counts() (ok, failed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.samples, m.failed
}

// recovered reports whether every partition, at sample s, has recovered
// from a fault whose last sample before it was before: it has committed
// past the end offset it had before the fault (a record produced after the
// fault was applied and its offset committed), or it has nothing left to
// consume (committed = end). It returns the partitions not yet recovered.
func recovered(before, s *sample) (bool, []int32) {
	var stuck []int32
	for p, end0 := range before.end {
		c := s.committed[p]
		if c > end0 || c == s.end[p] {
			continue
		}
		stuck = append(stuck, p)
	}
	sort.Slice(stuck, func(i, j int) bool { return stuck[i] < stuck[j] })
	return len(stuck) == 0, stuck
}

// lag is the records produced and not committed, over all partitions.
func (s *sample) lag() int64 {
	var n int64
	for p, e := range s.end {
		c := max(s.committed[p], 0)
		n += e - c
	}
	return n
}

// caughtUp reports whether every partition has committed its end offset.
func (s *sample) caughtUp() bool {
	for p, e := range s.end {
		if s.committed[p] != e {
			return false
		}
	}
	return true
}

// readShare is read over a share group: end offsets first, then the share
// lag, so that end - lag never overstates what was acknowledged.
func (m *monitor) readShare(ctx context.Context) (*sample, error) {
	at := time.Now()
	ends, err := m.adm.ListEndOffsets(ctx, m.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	ds, err := m.adm.DescribeShareGroupOffsets(ctx, m.group)
	if err == nil {
		err = ds.Error()
	}
	if err != nil {
		return nil, err
	}
	s := &sample{at: at, committed: make(map[int32]int64, m.partitions), end: make(map[int32]int64, m.partitions)}
	for p := range int32(m.partitions) {
		o, ok := ends.Lookup(m.topic, p)
		if !ok {
			return nil, fmt.Errorf("no end offset for partition %d", p)
		}
		s.end[p] = o.Offset
		s.committed[p] = -1
		if so, ok := ds[m.group].Offsets.Lookup(m.topic, p); ok && so.Err == nil && so.Lag >= 0 {
			s.committed[p] = max(o.Offset-so.Lag, 0)
		}
	}
	return s, nil
}
