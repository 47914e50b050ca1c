package share_test

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/share"
)

// The broker takes a share acknowledgement by offset and member: it
// settles whatever acquisition of that offset the member holds now. Once a
// session's acquisition of a record expired and the broker delivered the
// record to the same session again, an ack meant for the expired
// acquisition settles the newer one. These tests give records made here
// locks (LockRecordsForTest) and watch the acks the source marks
// (WatchAcksForTest): none may be for an acquisition the session holds a
// newer one of.

type ackLog struct {
	mu   sync.Mutex
	acks []string // "value status"
}

func (l *ackLog) add(r *kgo.Record, st kgo.AckStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := map[kgo.AckStatus]string{kgo.AckAccept: "accept", kgo.AckRelease: "release", kgo.AckReject: "reject", kgo.AckRenew: "renew"}[st]
	l.acks = append(l.acks, string(r.Value)+" "+name)
}

func (l *ackLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.acks...)
}

func reacquiredSetup(t *testing.T) (*share.Source, *ackLog, time.Time) {
	now := time.Now()
	undoLock := share.LockRecordsForTest(map[string]time.Time{
		"old": now.Add(-time.Second), // expired as the poll returned
		"a":   now.Add(10 * time.Second),
		"b":   now.Add(20 * time.Second),
		"new": now.Add(20 * time.Second),
	})
	var l ackLog
	undoAcks := share.WatchAcksForTest(l.add)
	t.Cleanup(func() { undoAcks(); undoLock() })
	return newIdle(t, 1), &l, now
}

// TestExpiredCopyInThePollIsNotReleased: a poll returns offset 3 twice,
// its first acquisition expired while the client buffered it and a newer
// one (fetched after the broker gave it back). The newer one is handed
// over; the expired one must not be released, which would make the
// record available while the handler runs it.
func TestExpiredCopyInThePollIsNotReleased(t *testing.T) {
	// Not parallel: it swaps the package's lock and ack functions.
	src, l, now := reacquiredSetup(t)
	rec := func(v string) *kgo.Record { return &kgo.Record{Topic: "t", Offset: 3, Value: []byte(v)} }
	b := src.PollForTest(0, []*kgo.Record{rec("old"), rec("new")}, now)
	if len(b) != 1 || len(b[0].Records) != 1 || b[0].Records[0].Offset != 3 {
		t.Fatalf("handed over %v, want offset 3 once", b)
	}
	for _, a := range l.all() {
		if a == "old release" {
			t.Fatalf("acks %v: the expired acquisition of offset 3 was released while its newer acquisition was handed over", l.all())
		}
	}
	src.Settle(runner.TP{Topic: "t"}, 3, runner.Accepted)
	if got := l.all(); len(got) != 1 || got[0] != "new accept" {
		t.Fatalf("acks %v, want [new accept]", got)
	}
}

// TestSettleAcksOnlyTheNewerAcquisition: the runner holds offset 5 from
// a poll of the session (a), whose lock then ran out; a later poll of the
// same session gets it again (b), kept as a copy. Settling it acks b, the
// acquisition the session holds, and not a, whose ack would either settle
// b too or, sent beside b's, be refused with every ack of the partition
// in its request.
func TestSettleAcksOnlyTheNewerAcquisition(t *testing.T) {
	// Not parallel: it swaps the package's lock and ack functions.
	src, l, now := reacquiredSetup(t)
	rec := func(v string) *kgo.Record { return &kgo.Record{Topic: "t", Offset: 5, Value: []byte(v)} }
	src.PollForTest(0, []*kgo.Record{rec("a")}, now)
	if b := src.PollForTest(0, []*kgo.Record{rec("b")}, now); len(b) != 0 {
		t.Fatalf("the second delivery was handed over again: %v", b)
	}
	src.Settle(runner.TP{Topic: "t"}, 5, runner.Accepted)
	if got := l.all(); len(got) != 1 || got[0] != "b accept" {
		t.Fatalf("acks %v, want [b accept]: one ack, for the acquisition the session holds", got)
	}
	if s0, all := src.HeldForTest(0); s0 != 0 || all != 0 {
		t.Fatalf("after the settle the session holds %d, the source %d; want 0 and 0", s0, all)
	}
}
