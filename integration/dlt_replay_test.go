//go:build integration

package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/runner"
)

// `tidemark dlt replay` against the real broker.

// dltRun runs `tidemark dlt replay` with args against the bed's broker and
// returns its exit status, stdout and stderr.
func dltRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(inboxBuildTidemark(t), append([]string{"dlt", "replay", "--brokers", strings.Join(bed.Kafka(t), ","), "--timeout", "1m"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

// dltLetter is a dead letter of topic/partition@offset as the runner
// writes it (built with the runner's header names).
func dltLetter(dlt, topic string, partition int32, offset int64, errText string) *kgo.Record {
	return &kgo.Record{Topic: dlt, Key: []byte(fmt.Sprintf("k%d", offset)), Value: []byte(fmt.Sprintf("v%d", offset)),
		Headers: []kgo.RecordHeader{
			{Key: "trace", Value: []byte("kept")},
			{Key: runner.HeaderError, Value: []byte(errText)},
			{Key: runner.HeaderErrorType, Value: []byte("*errors.errorString")},
			{Key: runner.HeaderErrorKind, Value: []byte("retryable")},
			{Key: runner.HeaderAttempts, Value: []byte("3")},
			{Key: runner.HeaderGroup, Value: []byte("svc")},
			{Key: runner.HeaderFirstFailure, Value: []byte("2026-12-01T10:00:00Z")},
			{Key: runner.HeaderLastFailure, Value: []byte("2026-12-01T10:00:01Z")},
			{Key: runner.HeaderOriginTopic, Value: []byte(topic)},
			{Key: runner.HeaderOriginPartition, Value: []byte(strconv.Itoa(int(partition)))},
			{Key: runner.HeaderOriginOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		}}
}

// dltRead reads every record of topic (up to its end now).
func dltRead(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	ends := bed.EndOffsets(t, topic)
	var total int64
	for _, e := range ends {
		total += e
	}
	if total == 0 {
		return nil
	}
	cl := bed.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatalf("reading %s: %v (%d of %d records)", topic, err, len(out), total)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// TestDLTReplayCommand: what the command replays and how. Of a dead-letter
// topic holding dead letters of two topics and a record without origin
// headers, it replays those of --to's topic only (by default), with key,
// value and headers — the origin headers and the record's own kept, the
// failure headers dropped; the filters choose among them; --dry-run
// lists and sends nothing; --group makes a second replay send nothing.
func TestDLTReplayCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dlt := bed.Topic(t, 2)
	orders := bed.Topic(t, 3)
	other := bed.Topic(t, 1)
	cl := bed.Client(t)
	letters := []*kgo.Record{
		dltLetter(dlt, orders, 0, 5, "poison: bad amount"),
		dltLetter(dlt, orders, 1, 9, "timeout calling the bank"),
		dltLetter(dlt, orders, 2, 12, "poison: bad currency"),
		dltLetter(dlt, other, 0, 3, "poison"),
		{Topic: dlt, Key: []byte("plain"), Value: []byte("no origin")},
	}
	for i, r := range letters {
		r.Partition = int32(i % 2)
	}
	if err := cl.ProduceSync(ctx, letters...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := dltRun(t, "--from", dlt, "--to", orders, "--dry-run")
	if code != 0 || !strings.Contains(out, "read 5 dead letters of "+dlt+", would replay 3 to "+orders+", left 1 no origin headers, 1 other origin topic") ||
		!strings.Contains(out, "origin "+orders+"/2@12\tpoison: bad currency") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errOut)
	}
	if n := len(dltRead(t, orders)); n != 0 {
		t.Fatalf("the dry run sent %d records", n)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--error", "poison"}, "would replay 2 to"},
		{[]string{"--partition", "1"}, "would replay 1 to"},
		{[]string{"--offsets", "6-12"}, "would replay 2 to"},
		{[]string{"--offsets", "5"}, "would replay 1 to"},
		{[]string{"--header", "trace=kept", "--error", "bank"}, "would replay 1 to"},
		{[]string{"--header", "trace=other"}, "would replay 0 to"},
		{[]string{"--origin-topic", "*"}, "would replay 4 to"},
		{[]string{"--origin-topic", other}, "would replay 1 to"},
	} {
		code, out, errOut := dltRun(t, append([]string{"--from", dlt, "--to", orders, "--dry-run"}, c.args...)...)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want %q\n%s%s", c.args, code, c.want, out, errOut)
		}
	}

	group := bed.Group(t)
	code, out, errOut = dltRun(t, "--from", dlt, "--to", orders, "--group", group)
	if code != 0 || !strings.Contains(out, "replayed 3 to "+orders) || !strings.Contains(out, "committed group "+group) {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	got := dltRead(t, orders)
	if len(got) != 3 {
		t.Fatalf("%d records on %s, want 3", len(got), orders)
	}
	for _, r := range got {
		hs := map[string]string{}
		var keys []string
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
			keys = append(keys, h.Key)
		}
		off := hs[runner.HeaderOriginOffset]
		want := []string{"trace", runner.HeaderOriginTopic, runner.HeaderOriginPartition, runner.HeaderOriginOffset}
		if strings.Join(keys, ",") != strings.Join(want, ",") || hs[runner.HeaderOriginTopic] != orders ||
			string(r.Key) != "k"+off || string(r.Value) != "v"+off {
			t.Errorf("replayed %s=%s headers %v, want key k%s, value v%s, headers %v", r.Key, r.Value, hs, off, off, want)
		}
	}
	// The group read everything: a second replay with it sends nothing.
	code, out, errOut = dltRun(t, "--from", dlt, "--to", orders, "--group", group)
	if code != 0 || !strings.Contains(out, "read 0 dead letters of "+dlt+", replayed 0") {
		t.Fatalf("second replay with the group: exit %d\n%s%s", code, out, errOut)
	}
	// A new dead letter: only it is read.
	if err := cl.ProduceSync(ctx, dltLetter(dlt, orders, 0, 77, "late")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = dltRun(t, "--from", dlt, "--to", orders, "--group", group)
	if code != 0 || !strings.Contains(out, "read 1 dead letters of "+dlt+", replayed 1") {
		t.Fatalf("replay after a new dead letter: exit %d\n%s%s", code, out, errOut)
	}
	if n := len(dltRead(t, orders)); n != 4 {
		t.Fatalf("%d records on %s, want 4", n, orders)
	}

	// Errors that name what was wrong.
	for _, c := range []struct {
		args []string
		code int // 1 a failure, 2 a usage error
		want string
	}{
		{[]string{"--from", "no-such-topic-" + dlt, "--to", orders}, 1, "does not exist"},
		{[]string{"--from", dlt, "--to", dlt}, 2, "--from and --to are both"},
	} {
		code, out, errOut := dltRun(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want %d and %q\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}
}

// TestDLTRedriveExactlyOnce: the whole loop over the broker. A member with
// the inbox and a DeadLetter policy dead-letters the records its effect
// cannot apply (a bug), and two it did apply but whose handler failed
// after the commit (an ambiguous commit). The bug is fixed, `tidemark dlt
// replay` republishes the six: each record has exactly one effect — the
// four applied now, the two not again. A second replay applies nothing.
func TestDLTRedriveExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 200
	pool := inboxDB(t)
	topic := bed.Topic(t, 3)
	dlt := bed.Topic(t, 1)
	group := bed.Group(t)
	bed.Produce(t, topic, n, func(i int) string { return fmt.Sprintf("key-%d", i%20) })

	var broken atomic.Bool
	broken.Store(true)
	poison := func(v string) bool { i, _ := strconv.Atoi(v); return i%50 == 7 } // 7, 57, 107, 157
	ambiguous := func(v string) bool { return v == "13" || v == "113" }
	s := inboxStore(t, pool, group)
	effect := func(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
		if broken.Load() && poison(string(rec.Value)) {
			return errors.New("poison: the effect has a bug")
		}
		return inboxEffect("m")(ctx, tx, rec)
	}
	h := runner.Chain(s.Handler(effect), func(next runner.Handler) runner.Handler {
		return func(ctx context.Context, rec runner.Record) error {
			err := next(ctx, rec)
			if err == nil && broken.Load() && ambiguous(string(rec.Value)) {
				return errors.New("the answer was lost after the commit")
			}
			return err
		}
	})
	m := startMember(t, "m", group, topic, h, runner.OnAssign(s.AssignHook()),
		runner.Failure(runner.DeadLetter(dlt, 2, nil)), runner.Backoff(5*time.Millisecond, 20*time.Millisecond))
	defer m.Stop(t)
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	if got := bed.EndOffsets(t, dlt)[0]; got != 6 {
		t.Fatalf("%d dead letters, want 6", got)
	}
	if e := inboxCount(t, pool, "SELECT count(*) FROM effects"); e != n-4 {
		t.Fatalf("%d effects before the redrive, want %d", e, n-4)
	}

	broken.Store(false) // the fix is deployed
	code, out, errOut := dltRun(t, "--from", dlt, "--to", topic)
	if code != 0 || !strings.Contains(out, "replayed 6 to "+topic) {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	dltOnce(t, pool, n)
	replays := s.Stats().Replays
	if replays < 2 {
		t.Fatalf("%d replays, want at least the two ambiguous records", replays)
	}

	code, out, errOut = dltRun(t, "--from", dlt, "--to", topic)
	if code != 0 || !strings.Contains(out, "replayed 6 to "+topic) {
		t.Fatalf("second replay: exit %d\n%s%s", code, out, errOut)
	}
	waitCommitted(t, group, topic, bed.EndOffsets(t, topic), time.Minute)
	dltOnce(t, pool, n)
	if got := s.Stats().Replays - replays; got != 6 {
		t.Fatalf("the second replay counted %d replays, want 6", got)
	}
	if got := bed.EndOffsets(t, dlt)[0]; got != 6 {
		t.Fatalf("%d dead letters after the redrives, want still 6", got)
	}
}

// dltOnce checks that each of the n produced values has exactly one effect.
func dltOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	effects := inboxCount(t, pool, "SELECT count(*) FROM effects")
	distinct := inboxCount(t, pool, "SELECT count(DISTINCT value) FROM effects")
	if effects != int64(n) || distinct != int64(n) {
		t.Fatalf("%d effects of %d distinct records, want %d of each", effects, distinct, n)
	}
}

// TestDLTReplayOfExpiredDeadLetters: a dead-letter topic whose records are
// all gone (retention.ms, or kafka-delete-records) still has its end
// offsets above 0. There is nothing to read, and the command says so at
// once: it must not wait for records below the log start offset that will
// never come, until --timeout, and then fail.
func TestDLTReplayOfExpiredDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dlt := bed.Topic(t, 1)
	orders := bed.Topic(t, 1)
	if err := bed.Client(t).ProduceSync(ctx, dltLetter(dlt, orders, 0, 1, "x"), dltLetter(dlt, orders, 0, 2, "x")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	del := kadm.Offsets{}
	del.Add(kadm.Offset{Topic: dlt, Partition: 0, At: 2, LeaderEpoch: -1})
	resp, err := bed.Admin(t).DeleteRecords(ctx, del)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("deleting the dead letters: %v", err)
	}
	start := time.Now()
	cmd := exec.Command(inboxBuildTidemark(t), "dlt", "replay", "--brokers", strings.Join(bed.Kafka(t), ","), "--timeout", "20s",
		"--from", dlt, "--to", orders)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "read 0 dead letters") {
		t.Fatalf("replay of a dead-letter topic with no records left: %v after %v\n%s", err, time.Since(start).Round(time.Second), out)
	}
}

// TestDLTReplayUnreachableBroker: a broker that cannot be reached is an
// error that names it, with exit status 1, well before --timeout.
func TestDLTReplayUnreachableBroker(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cmd := exec.Command(inboxBuildTidemark(t), "dlt", "replay", "--brokers", "127.0.0.1:1", "--timeout", "2m",
		"--from", "x.dlt", "--to", "x")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "127.0.0.1:1") || time.Since(start) > time.Minute {
		t.Fatalf("unreachable broker: %v after %v, want exit 1 naming it within a minute\n%s", err, time.Since(start).Round(time.Second), out)
	}
}
