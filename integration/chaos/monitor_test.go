//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	for p := range m.topicPartitions(ends) {
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

// topicPartitions is the number of partitions of the topic: the initial
// count, or more once partitions were added (the admin client's metadata
// lists them).
func (m *monitor) topicPartitions(ends kadm.ListedOffsets) int32 {
	return int32(max(m.partitions, len(ends[m.topic])))
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
	for p := range m.topicPartitions(ends) {
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

// leases samples the inbox's partition leases every interval for the whole
// run and keeps, for each partition and lease epoch, the database's clock
// when a sample first saw it. A lease epoch is raised by the bump of a new
// assignment; from then on the fence refuses every inbox row of an older
// epoch of the partition (the row must match the lease at COMMIT, and the
// bump waits for a commit that holds the lease). So a row of epoch E that
// committed after a newer epoch of its partition was seen was committed by
// an owner already fenced: its effect landed although its owner had lost
// the partition. The commit times come from auditCommits' trigger; the
// sampling only delays "first seen", so that reading has no false alarms.
type leases struct {
	pool         *pgxpool.Pool
	group, topic string
	interval     time.Duration

	mu     sync.Mutex
	seen   map[int32]map[int64]time.Time // partition → epoch → first seen
	failed int
}

func newLeases(pool *pgxpool.Pool, group, topic string, interval time.Duration) *leases {
	return &leases{pool: pool, group: group, topic: topic, interval: interval, seen: map[int32]map[int64]time.Time{}}
}

// run samples until ctx ends.
func (l *leases) run(ctx context.Context) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		l.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once takes one sample; a failed one (PostgreSQL restarting) is counted.
func (l *leases) once(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	type row struct {
		p  int32
		e  int64
		at time.Time
	}
	var got []row
	rows, err := l.pool.Query(ctx, `SELECT partition, epoch, clock_timestamp() FROM tidemark_lease WHERE group_id = $1 AND topic = $2`, l.group, l.topic)
	if err == nil {
		for rows.Next() {
			var r row
			if err = rows.Scan(&r.p, &r.e, &r.at); err != nil {
				break
			}
			got = append(got, r)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed++
		return
	}
	for _, r := range got {
		if l.seen[r.p] == nil {
			l.seen[r.p] = map[int64]time.Time{}
		}
		if _, ok := l.seen[r.p][r.e]; !ok {
			l.seen[r.p][r.e] = r.at
		}
	}
}

// supersededAt returns, per partition and epoch, the earliest time a
// newer epoch of the partition was seen (missing: never).
func (l *leases) supersededAt() map[int32]map[int64]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int32]map[int64]time.Time{}
	for p, epochs := range l.seen {
		es := make([]int64, 0, len(epochs))
		for e := range epochs {
			es = append(es, e)
		}
		sort.Slice(es, func(i, j int) bool { return es[i] < es[j] })
		out[p] = map[int64]time.Time{}
		var earliest time.Time // of the epochs above es[i]
		for i := len(es) - 1; i >= 0; i-- {
			if !earliest.IsZero() {
				out[p][es[i]] = earliest
			}
			if at := epochs[es[i]]; earliest.IsZero() || at.Before(earliest) {
				earliest = at
			}
		}
	}
	return out
}

// landedFenced returns the inbox rows of the run that committed after a
// newer lease epoch of their partition had been seen: effects of a fenced
// owner that landed.
func (l *leases) landedFenced(ctx context.Context) ([]string, error) {
	sup := l.supersededAt()
	rows, err := l.pool.Query(ctx, `SELECT partition, "offset", epoch, committing FROM chaos_inbox_commits WHERE group_id = $1 AND topic = $2`, l.group, l.topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p int32
		var o, e int64
		var at time.Time
		if err := rows.Scan(&p, &o, &e, &at); err != nil {
			return nil, err
		}
		if s, ok := sup[p][e]; ok && at.After(s) {
			out = append(out, fmt.Sprintf("%d@%d under epoch %d, committed %s after a newer epoch was seen at %s",
				p, o, e, at.Sub(s).Round(time.Millisecond), s.Format("15:04:05.000")))
		}
	}
	sort.Strings(out)
	return out, rows.Err()
}

// epochs returns the number of lease epochs seen and failed samples.
func (l *leases) counts() (epochs, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, es := range l.seen {
		epochs += len(es)
	}
	return epochs, l.failed
}

// auditCommits creates, in the run's schema, a table that receives one row
// per inbox row committed, with the database's clock at its commit: a
// deferred trigger on the inbox runs at COMMIT, after the inbox's fence
// trigger (triggers of one event fire in name order), and its row commits
// or rolls back with the transaction. The inbox's tables must exist.
func auditCommits(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
CREATE TABLE chaos_inbox_commits (
	group_id   text NOT NULL,
	topic      text NOT NULL,
	partition  integer NOT NULL,
	"offset"   bigint NOT NULL,
	epoch      bigint NOT NULL,
	committing timestamptz NOT NULL
);
CREATE FUNCTION chaos_inbox_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO chaos_inbox_commits VALUES (NEW.group_id, NEW.topic, NEW.partition, NEW."offset", NEW.epoch, clock_timestamp());
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER zz_chaos_inbox_commit AFTER INSERT ON tidemark_inbox
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_inbox_commit();`)
	return err
}

// breakFence replaces the inbox's commit-time fence with one that lets
// every row through, in the run's schema only: TIDEMARK_CHAOS_BREAK_FENCE=1,
// to see the fenced-owner check fail (docs/chaos.md). The claim still
// checks the lease when a transaction begins; what no longer holds is that
// a transaction that claimed before a bump cannot commit after it.
func breakFence(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION tidemark_inbox_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RETURN NULL;
END
$$`)
	return err
}
