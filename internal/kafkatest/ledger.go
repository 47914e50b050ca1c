package kafkatest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Ledger records every record a test's consumers handled: which member
// handled each offset of each partition and how often, in call order. Its
// checks (ExactlyOnce, AtLeastOnce, KeyOrder, PartitionOrder) read what it
// holds so far. The zero Ledger is not ready to use (call NewLedger); its
// methods are safe for concurrent use.
type Ledger struct {
	mu        sync.Mutex
	calls     map[runner.TP]map[int64][]string // offset → members that handled it, in call order
	order     map[runner.TP][]int64            // offsets in call order
	byKey     map[string][]handling            // key → its handlings in call order
	completed map[runner.TP]int64              // handler calls that returned nil
	running   map[string]int                   // member → handler calls running
	byMember  map[string]int                   // member → handlings
	values    map[string]int                   // value → handlings
	total     int
}

type handling struct {
	tp     runner.TP
	offset int64
}

// NewLedger returns an empty Ledger.
func NewLedger() *Ledger {
	return &Ledger{
		calls:     map[runner.TP]map[int64][]string{},
		order:     map[runner.TP][]int64{},
		byKey:     map[string][]handling{},
		completed: map[runner.TP]int64{},
		running:   map[string]int{},
		byMember:  map[string]int{},
		values:    map[string]int{},
	}
}

// Handler returns h (nil: a handler that does nothing) wrapped so that l
// records each call as a handling by member before h runs, counts it
// running in member while h runs, and counts it completed for its
// partition when h returns nil.
func (l *Ledger) Handler(member string, h runner.Handler) runner.Handler {
	return func(ctx context.Context, rec runner.Record) error {
		l.mu.Lock()
		l.add(member, rec)
		l.running[member]++
		l.mu.Unlock()
		var err error
		if h != nil {
			err = h(ctx, rec)
		}
		l.mu.Lock()
		l.running[member]--
		if err == nil {
			l.completed[rec.TP()]++
		}
		l.mu.Unlock()
		return err
	}
}

// Add records rec as handled by member, for consumers that are not a
// runner's handlers (a plain client's poll loop).
func (l *Ledger) Add(member string, rec runner.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.add(member, rec)
}

func (l *Ledger) add(member string, rec runner.Record) {
	tp := rec.TP()
	if l.calls[tp] == nil {
		l.calls[tp] = map[int64][]string{}
	}
	l.calls[tp][rec.Offset] = append(l.calls[tp][rec.Offset], member)
	l.order[tp] = append(l.order[tp], rec.Offset)
	k := string(rec.Key)
	l.byKey[k] = append(l.byKey[k], handling{tp, rec.Offset})
	l.byMember[member]++
	l.values[string(rec.Value)]++
	l.total++
}

// Count is how many handlings l holds, repeats included.
func (l *Ledger) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// CountBy is how many handlings of member l holds, repeats included.
func (l *Ledger) CountBy(member string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byMember[member]
}

// Completed is how many handler calls on tp returned nil (see Handler).
func (l *Ledger) Completed(tp runner.TP) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.completed[tp]
}

// Running is how many handler calls of member are running now (see
// Handler).
func (l *Ledger) Running(member string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running[member]
}

// HandledBy returns the members that handled tp@offset, in call order (a
// member twice if it handled it twice).
func (l *Ledger) HandledBy(tp runner.TP, offset int64) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls[tp][offset])
}

// Offsets returns the distinct offsets of tp that were handled, sorted.
func (l *Ledger) Offsets(tp runner.TP) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.calls[tp]))
}

// Uniform returns the end offsets of partitions partitions holding per
// records each, for ExactlyOnce and AtLeastOnce.
func Uniform(partitions int32, per int64) map[int32]int64 {
	out := make(map[int32]int64, partitions)
	for p := range partitions {
		out[p] = per
	}
	return out
}

// ExactlyOnce returns an error naming the first offset of topic (partitions
// in order) that was handled other than once: below a partition's end in
// ends and handled never or more than once, or at or past the end and
// handled at all (records of a partition ends does not name count too).
// Offsets that hold no record (transaction markers, aborted records) must
// be left out by the caller: use ValuesOnce there.
func (l *Ledger) ExactlyOnce(topic string, ends map[int32]int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.belowEnds(topic, ends, func(n int) bool { return n != 1 }, "want once"); err != nil {
		return err
	}
	for tp, offs := range l.calls {
		if tp.Topic != topic {
			continue
		}
		end, ok := ends[tp.Partition]
		for off := range offs {
			if !ok || off >= end {
				return fmt.Errorf("%s@%d handled, past the end %d", tp, off, end)
			}
		}
	}
	return nil
}

// AtLeastOnce returns an error naming the first offset below a partition's
// end in ends (partitions in order) of topic that was never handled.
func (l *Ledger) AtLeastOnce(topic string, ends map[int32]int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.belowEnds(topic, ends, func(n int) bool { return n == 0 }, "want at least once")
}

// belowEnds returns an error naming the first offset below a partition's
// end whose number of handlings is bad. l.mu is held.
func (l *Ledger) belowEnds(topic string, ends map[int32]int64, bad func(handlings int) bool, want string) error {
	for _, p := range slices.Sorted(maps.Keys(ends)) {
		tp := runner.TP{Topic: topic, Partition: p}
		for off := range ends[p] {
			if by := l.calls[tp][off]; bad(len(by)) {
				return fmt.Errorf("%s@%d handled %d times (by %q), %s", tp, off, len(by), by, want)
			}
		}
	}
	return nil
}

// ValuesOnce returns an error naming the first value (in order) that was
// handled and is not in want, or was handled more than once, or is in want
// and was never handled; for records whose offsets are not known in
// advance (transactions: aborted records and markers take offsets too).
func (l *Ledger) ValuesOnce(want map[string]bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range slices.Sorted(maps.Keys(l.values)) {
		switch n := l.values[v]; {
		case !want[v]:
			return fmt.Errorf("value %q handled %d times, want none", v, n)
		case n != 1:
			return fmt.Errorf("value %q handled %d times, want once", v, n)
		}
	}
	for _, v := range slices.Sorted(maps.Keys(want)) {
		if want[v] && l.values[v] == 0 {
			return fmt.Errorf("value %q never handled, want once", v)
		}
	}
	return nil
}

// KeyOrder returns an error naming the first key (in key order) whose
// handlings, in call order, were not all on one partition in rising
// offset order: Kafka keeps a key on one partition and a runner hands a
// key's records over one at a time. A repeat of an offset breaks the
// order too, so the check holds only where nothing was handled twice.
// Records without a key are not checked.
func (l *Ledger) KeyOrder() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(l.byKey)) {
		hs := l.byKey[k]
		if k == "" {
			continue
		}
		for i := 1; i < len(hs); i++ {
			switch prev, h := hs[i-1], hs[i]; {
			case h.tp != prev.tp:
				return fmt.Errorf("key %q handled on %s and %s", k, prev.tp, h.tp)
			case h.offset <= prev.offset:
				return fmt.Errorf("key %q: %s@%d handled after offset %d", k, h.tp, h.offset, prev.offset)
			}
		}
	}
	return nil
}

// PartitionOrder returns an error naming the first partition (in order)
// whose handlings, in call order, were not in rising offset order, as a
// plain client delivers them.
func (l *Ledger) PartitionOrder() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tps := slices.SortedFunc(maps.Keys(l.order), compareTP)
	for _, tp := range tps {
		offs := l.order[tp]
		for i := 1; i < len(offs); i++ {
			if offs[i] <= offs[i-1] {
				return fmt.Errorf("%s: offset %d handled after %d", tp, offs[i], offs[i-1])
			}
		}
	}
	return nil
}

func compareTP(a, b runner.TP) int {
	return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
}
