package dltcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/cli"
	"github.com/tidemark/tidemark/pkg/runner"
)

// cmdName prefixes the command's messages.
const cmdName = "tidemark dlt replay"

// produceChunk is how many records a replay sends before it waits for
// their acknowledgements.
const produceChunk = 500

// headerFlags collects repeated --header flags.
type headerFlags []HeaderMatch

func (h *headerFlags) String() string { return "" }
func (h *headerFlags) Set(s string) error {
	m, err := ParseHeader(s)
	if err != nil {
		return err
	}
	*h = append(*h, m)
	return nil
}

// Replay runs `tidemark dlt replay` with args (the words after "replay")
// and returns the process's exit status: 0 when every dead letter chosen
// was republished and acknowledged (or, with --dry-run, listed), 2 for a
// usage error, 1 for a failure, which it explains on stderr.
func Replay(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(cmdName)
	brokers := fs.String("brokers", "", "Kafka `brokers`, comma-separated host:port; default $TIDEMARK_KAFKA_BROKERS")
	from := fs.String("from", "", "the dead-letter `topic` to read, required")
	to := fs.String("to", "", "the `topic` to republish to, required")
	originTopic := fs.String("origin-topic", "", "replay only dead letters whose origin topic is this (default: the --to topic; * for any)")
	partition := fs.Int("partition", -1, "replay only dead letters of this origin partition")
	offsets := fs.String("offsets", "", "replay only dead letters whose origin offset is in this `range`: FROM-TO, FROM- or OFFSET (inclusive)")
	errText := fs.String("error", "", "replay only dead letters whose error or error type contains this `text`")
	var headers headerFlags
	fs.Var(&headers, "header", "replay only dead letters with this header: `KEY=VALUE` (the last header KEY is VALUE) or KEY (present); repeatable, all must match")
	group := fs.String("group", "", "resume from this consumer `group`'s committed offsets on --from and commit what was read once it is republished (default: read from the beginning, commit nothing)")
	dryRun := fs.Bool("dry-run", false, "list what would be replayed; republish and commit nothing")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tidemark dlt replay --from TOPIC.dlt --to TOPIC [--origin-topic T|*] [--partition N]
       [--offsets FROM-TO] [--error TEXT] [--header KEY[=VALUE]]... [--group G] [--dry-run] [--brokers B]

Republishes dead letters (records a tidemark runner wrote to a dead-letter
topic) to --to: reads --from from the beginning (or from --group's committed
offsets) up to its end when the command starts, and sends each chosen record
with its key, value and headers — the tidemark-origin-* headers kept, the
failure headers (tidemark-error*, -attempts, -first/last-failure, -group)
dropped — with acks=all and an idempotent producer, in --from's order per
partition, partitioned by key as any producer does, with a new timestamp
(the original is in tidemark-origin-timestamp). A pkg/inbox handler recognises a republished record by its
origin headers: one whose origin was applied (or was redriven before) is a
replay, so replaying twice applies nothing twice.

Only dead letters with origin headers are replayed, and by default only
those whose origin topic is --to: a dead-letter topic shared by several
topics is not replayed into the wrong one. A dead letter the runner cut
(tidemark-dead-letter-cut: the broker refused the whole record) has no
value to replay and is left. Every group consuming --to
receives the records; a group without pkg/inbox applies them again.

With --group the command commits the end offsets it read on --from once
every chosen record is acknowledged (nothing when one failed), so the next
replay with the same group starts after them; the group records what was
read, whatever the filter chose. --dry-run lists each dead letter it would
replay and changes nothing. Exit status 2 for a usage error (nothing was
read), 1 for a failure.
`)
		fs.PrintDefaults()
	}
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	usage := func(format string, a ...any) int { return cli.Usagef(stderr, cmdName, format, a...) }
	fail := func(format string, a ...any) int { return cli.Failf(stderr, cmdName, format, a...) }
	f := Filter{Partition: int32(*partition), To: -1, Error: *errText, Headers: headers}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected argument %q", fs.Arg(0))
	case *from == "":
		return usage("--from is required: the dead-letter topic to read")
	case *to == "":
		return usage("--to is required: the topic to republish to")
	case *from == *to:
		return usage("--from and --to are both %q: a replay would read its own records", *from)
	case *partition < -1 || *partition > 1<<31-1:
		return usage("--partition %d is not a partition number", *partition)
	case *timeout <= 0:
		return usage("--timeout %v is not positive", *timeout)
	}
	switch *originTopic {
	case "":
		f.OriginTopic = *to
	case "*":
	default:
		f.OriginTopic = *originTopic
	}
	if *offsets != "" {
		var err error
		if f.From, f.To, err = ParseOffsets(*offsets); err != nil {
			return usage("%v", err)
		}
	}
	list, source := *brokers, "--brokers"
	if list == "" {
		list, source = os.Getenv("TIDEMARK_KAFKA_BROKERS"), "TIDEMARK_KAFKA_BROKERS"
	}
	if strings.TrimSpace(list) == "" {
		return usage("no brokers: pass --brokers or set TIDEMARK_KAFKA_BROKERS")
	}
	seeds, err := cli.Brokers(list, source)
	if err != nil {
		return usage("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r := &replay{from: *from, to: *to, group: *group, filter: f, dryRun: *dryRun, stdout: stdout}
	sum, err := r.run(ctx, seeds)
	if err == nil || sum.Read > 0 {
		fmt.Fprintln(stdout, sum.String(r)) // what was done before a failure, too
	}
	if err != nil {
		if ctx.Err() != nil {
			return fail("%v (after --timeout %v)", err, *timeout)
		}
		return fail("%v", err)
	}
	return cli.ExitOK
}

// replay is one run of the command.
type replay struct {
	from, to, group string
	filter          Filter
	dryRun          bool
	stdout          io.Writer
}

// summary counts what a replay did.
type summary struct {
	Read      int
	Replayed  int
	Left      map[string]int
	Committed bool
}

func (s summary) String(r *replay) string {
	verb := "replayed"
	if r.dryRun {
		verb = "would replay"
	}
	out := fmt.Sprintf("tidemark dlt replay: read %d dead letters of %s, %s %d to %s", s.Read, r.from, verb, s.Replayed, r.to)
	var left []string
	for _, why := range []string{LeftNoOrigin, LeftOtherOrigin, LeftCut, LeftFiltered} {
		if n := s.Left[why]; n > 0 {
			left = append(left, fmt.Sprintf("%d %s", n, why))
		}
	}
	if len(left) > 0 {
		out += ", left " + strings.Join(left, ", ")
	}
	if s.Committed {
		out += "; committed group " + r.group
	}
	return out
}

func (r *replay) run(ctx context.Context, seeds []string) (summary, error) {
	sum := summary{Left: map[string]int{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()), // acks=all; idempotent writes are kgo's default
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers come as records, so that the last offset
		// before the end is seen even when it is one.
		kgo.KeepControlRecords())
	if err != nil {
		return sum, fmt.Errorf("--brokers: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	// The end: the last stable offset of each partition now. Records
	// dead-lettered while the command runs are left for the next replay.
	ends, err := adm.ListCommittedOffsets(ctx, r.from)
	if err == nil {
		err = ends.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return sum, fmt.Errorf("topic %s does not exist", r.from)
	}
	if err != nil {
		return sum, fmt.Errorf("listing the end offsets of %s: %w", r.from, err)
	}
	if _, ok := ends[r.from]; !ok {
		return sum, fmt.Errorf("topic %s does not exist", r.from)
	}
	// The log start: records below it are gone (retention.ms, deleted
	// records); waiting for them would wait until --timeout.
	logStarts, err := adm.ListStartOffsets(ctx, r.from)
	if err == nil {
		err = logStarts.Error()
	}
	if err != nil {
		return sum, fmt.Errorf("listing the start offsets of %s: %w", r.from, err)
	}
	starts := map[int32]int64{}
	if r.group != "" {
		resp, err := adm.FetchOffsets(ctx, r.group)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return sum, fmt.Errorf("fetching group %s's offsets: %w", r.group, err)
		}
		for p := range ends[r.from] {
			if o, ok := resp.Lookup(r.from, p); ok && o.At >= 0 {
				starts[p] = o.At
			}
		}
	}
	consume := map[int32]kgo.Offset{}
	pending := map[int32]int64{} // partitions with records to read: their end
	for p, lo := range ends[r.from] {
		start, ok := starts[p]
		if !ok {
			consume[p] = kgo.NewOffset().AtStart()
			start = 0
		} else {
			consume[p] = kgo.NewOffset().At(start)
		}
		if ls, ok := logStarts.Lookup(r.from, p); ok && ls.Offset > start {
			start = ls.Offset
		}
		if lo.Offset > start {
			pending[p] = lo.Offset
		}
	}
	if len(pending) > 0 {
		cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{r.from: consume})
	}

	var out []*kgo.Record
	for len(pending) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return sum, fmt.Errorf("reading %s: %w", r.from, err)
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("reading %s/%d: %w", t, p, err))
		})
		if ferr != nil {
			return sum, ferr
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			end, ok := pending[rec.Partition]
			if !ok || rec.Offset >= end {
				return
			}
			if rec.Offset+1 >= end {
				delete(pending, rec.Partition)
			}
			if rec.Attrs.IsControl() {
				return
			}
			sum.Read++
			hs := make([]runner.Header, len(rec.Headers))
			for i, h := range rec.Headers {
				hs[i] = runner.Header{Key: h.Key, Value: h.Value}
			}
			o, why := r.filter.Match(hs)
			if why != "" {
				sum.Left[why]++
				return
			}
			if r.dryRun {
				e, _ := header(hs, runner.HeaderError)
				fmt.Fprintf(r.stdout, "%s/%d@%d\torigin %s\t%s\n", rec.Topic, rec.Partition, rec.Offset, o, oneLine(e, 120))
				sum.Replayed++
				return
			}
			kh := make([]kgo.RecordHeader, 0, len(rec.Headers))
			for _, h := range Republished(hs) {
				kh = append(kh, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
			out = append(out, &kgo.Record{Topic: r.to, Key: rec.Key, Value: rec.Value, Headers: kh})
		})
		if len(out) >= produceChunk || (len(pending) == 0 && len(out) > 0) {
			n, err := r.produce(ctx, cl, out)
			sum.Replayed += n
			if err != nil {
				return sum, err
			}
			out = out[:0]
		}
	}
	if r.dryRun || r.group == "" {
		return sum, nil
	}
	commit := kadm.Offsets{}
	for p, lo := range ends[r.from] {
		if start, ok := starts[p]; ok && start >= lo.Offset {
			continue // nothing read: never move a committed offset back
		}
		commit.Add(kadm.Offset{Topic: r.from, Partition: p, At: lo.Offset, LeaderEpoch: -1})
	}
	resp, err := adm.CommitOffsets(ctx, r.group, commit)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return sum, fmt.Errorf("committing group %s's offsets on %s (every chosen record was republished): %w", r.group, r.from, err)
	}
	sum.Committed = true
	return sum, nil
}

// produce sends recs and waits for their acknowledgements; it returns how
// many were acknowledged before the first failure.
func (r *replay) produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) (int, error) {
	res := cl.ProduceSync(ctx, recs...)
	n := 0
	for _, pr := range res {
		if pr.Err == nil {
			n++
		}
	}
	if err := res.FirstErr(); err != nil {
		return n, fmt.Errorf("republishing to %s (%d of %d records of this round acknowledged; nothing committed): %w", r.to, n, len(recs), err)
	}
	return n, nil
}

// oneLine is b on one line, at most n bytes, for the dry-run listing.
func oneLine(b []byte, n int) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
