package main

// The meter: a child's measuring window, its record count and its
// latency samples, and the produce-time stamp those samples read.

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/internal/pgtrace"
)

// The stamp a live run's producer writes at the head of a record's value.
const (
	stampMagic = "TMTS"
	stampLen   = len(stampMagic) + 8
)

// meter times a child's window, counts its records and keeps its latency
// samples. Its methods are safe for concurrent use.
type meter struct {
	limit  int64
	runFor time.Duration
	live   bool
	parts  int

	warmMu sync.Mutex
	warm   map[int32]bool

	count    atomic.Int64
	started  atomic.Bool
	startMu  sync.Mutex
	first    time.Time
	firstCPU time.Duration

	stopOnce sync.Once
	done     chan struct{}
	records  int64
	end      time.Time
	endCPU   time.Duration

	latMu sync.Mutex
	lat   []time.Duration

	perTx float64             // set by the inbox consumer as it ends
	rt    *pgtrace.RoundTrips // the PostgreSQL consumers' round trips, or nil

	fetch, fetchEnd *fetchSettings // the franz-go client's, when it has one

	gated     bool
	readyOnce sync.Once
	goCh      chan struct{} // closed by awaitGo
	offsets   *tracker      // nil unless the spec tracks offsets
	again     atomic.Int64  // handler calls of records delivered more than once
}

func newMeter(s childSpec) *meter {
	m := &meter{limit: int64(s.Records), runFor: s.For, live: s.Live, parts: s.Partitions,
		warm: map[int32]bool{}, done: make(chan struct{}), gated: s.Gated, goCh: make(chan struct{})}
	if s.TrackOffsets > 0 {
		m.offsets = newTracker(max(s.Partitions, 1), s.TrackOffsets)
	}
	return m
}

// gate holds a gated child's handlers until the harness says go; the first
// call says ready. It returns at once in a child that is not gated.
func (m *meter) gate(ctx context.Context) {
	if !m.gated {
		return
	}
	m.readyOnce.Do(func() { fmt.Println(readyLine) })
	select {
	case <-m.goCh:
	case <-ctx.Done():
	}
}

// awaitGo reads r (the child's stdin) until goLine, starts the window and
// opens the gate. The window starts at go, not at the first record after
// it: a process that gets no record (the others hold them all) then ends
// on time with none, and the processes of a run share one window.
func (m *meter) awaitGo(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() == goLine {
			m.startWindow(time.Now())
			close(m.goCh)
			return
		}
	}
}

// finished notes a record whose handler finished, with its delivery count.
func (m *meter) finished(partition int32, offset int64, deliveries int32) {
	if deliveries > 1 {
		m.again.Add(1)
	}
	if m.offsets != nil {
		m.offsets.done(partition, offset)
	}
}

// begin is called when a record's handling starts, with its partition and
// value, and reports whether the record counts. In a drain run every
// record counts and the first starts the window. In a live run only
// stamped records count, the first of them starts the window, and their
// latency is sampled; the others are warm-up records.
func (m *meter) begin(partition int32, value []byte) bool {
	if !m.live {
		// The throughput phase reads the clock only for the first
		// record, as the plain loops do: a clock read per record would
		// be charged to tidemark's no-op handler alone.
		if !m.started.Load() {
			m.startWindow(time.Now())
		}
		return true
	}
	now := time.Now()
	ts, ok := unstamp(value)
	if !ok {
		m.warmUp(partition)
		return false
	}
	m.startWindow(now)
	m.latMu.Lock()
	m.lat = append(m.lat, now.Sub(ts))
	m.latMu.Unlock()
	return true
}

func (m *meter) startWindow(now time.Time) {
	if m.started.Load() {
		return
	}
	m.startMu.Lock()
	defer m.startMu.Unlock()
	if m.started.Load() {
		return
	}
	m.first, m.firstCPU = now, processCPU()
	m.started.Store(true)
	if m.runFor > 0 {
		time.AfterFunc(m.runFor, m.stop)
	}
}

// warmUp notes a warm-up record from partition and says ready once every
// partition has sent one.
func (m *meter) warmUp(partition int32) {
	m.warmMu.Lock()
	defer m.warmMu.Unlock()
	if len(m.warm) == m.parts {
		return
	}
	m.warm[partition] = true
	if len(m.warm) == m.parts {
		fmt.Println(readyLine)
	}
}

// add counts n finished records and stops the window at the limit.
func (m *meter) add(n int) {
	if c := m.count.Add(int64(n)); m.limit > 0 && c >= m.limit {
		m.stop()
	}
}

func (m *meter) stop() {
	m.stopOnce.Do(func() {
		m.end, m.endCPU = time.Now(), processCPU()
		m.records = m.count.Load()
		close(m.done)
	})
}

func (m *meter) stopped() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

func (m *meter) result() childResult {
	r := childResult{Records: int(m.records), Seconds: m.end.Sub(m.first).Seconds(), WindowCPU: (m.endCPU - m.firstCPU).Seconds(),
		PerTransaction: m.perTx, Fetch: m.fetch, FetchEnd: m.fetchEnd}
	if m.rt != nil {
		r.RoundTrips = m.rt.Total()
	}
	if m.started.Load() {
		r.FirstNS, r.EndNS = m.first.UnixNano(), m.end.UnixNano()
	}
	r.Redelivered = m.again.Load()
	if m.offsets != nil {
		r.Seen, r.Again = m.offsets.ranges()
		r.Outside = m.offsets.outside.Load()
	}
	m.latMu.Lock()
	defer m.latMu.Unlock()
	if len(m.lat) > 0 {
		r.P50, r.P99 = latencies(m.lat)
		r.Samples = len(m.lat)
	}
	return r
}

// stamp writes the produce time into the head of value, which must be at
// least stampLen bytes; unstamp reads it back. The record's own Kafka
// timestamp would do, but it has millisecond resolution.
func stamp(value []byte, t time.Time) {
	copy(value, stampMagic)
	binary.BigEndian.PutUint64(value[len(stampMagic):], uint64(t.UnixNano()))
}

func unstamp(value []byte) (time.Time, bool) {
	if len(value) < stampLen || string(value[:len(stampMagic)]) != stampMagic {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(value[len(stampMagic):]))), true
}
