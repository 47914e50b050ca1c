package lab

import (
	"bufio"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/tidemark/tidemark/pkg/rebalance"
	"github.com/tidemark/tidemark/pkg/watermark"
)

// Strategy is the rule the lab checks: the prefix rule tidemark uses, or the
// naive max(completed)+1 rule, which the lab runs beside it to show where it
// would commit past unfinished records.
type Strategy uint8

const (
	// Prefix is the contiguous completed prefix of delivered records.
	Prefix Strategy = iota
	// Naive is max(completed offset)+1: deliberately wrong.
	Naive
)

// String returns "prefix" or "naive".
func (s Strategy) String() string {
	if s == Naive {
		return "naive"
	}
	return "prefix"
}

// ParseStrategy parses "prefix" or "naive".
func ParseStrategy(s string) (Strategy, error) {
	switch s {
	case "prefix":
		return Prefix, nil
	case "naive":
		return Naive, nil
	}
	return 0, fmt.Errorf("lab: unknown strategy %q (want prefix or naive)", s)
}

// ErrMalformed is matched (with errors.Is) by every [*ScriptError].
var ErrMalformed = errors.New("lab: malformed script")

// ScriptError reports a malformed line: an unknown op, a bad number or
// argument count, an out-of-order delivery or position, an epoch that does
// not increase, or a deliver or revoke while the partition is not owned.
type ScriptError struct {
	// Line is the 1-based line number in the script.
	Line int
	// Msg says what is wrong with it.
	Msg string
}

// Error returns "line N: what is wrong".
func (e *ScriptError) Error() string { return "line " + strconv.Itoa(e.Line) + ": " + e.Msg }

// Is reports whether target is [ErrMalformed].
func (e *ScriptError) Is(target error) bool { return target == ErrMalformed }

//go:embed cases/*.lab
var cases embed.FS

// Cases returns the names of the built-in scripts: normal, stale and handoff.
func Cases() []string { return []string{"normal", "stale", "handoff"} }

// Case returns the built-in script called name.
func Case(name string) (string, error) {
	b, err := cases.ReadFile("cases/" + name + ".lab")
	if err != nil {
		return "", fmt.Errorf("lab: unknown case %q (want one of %s)", name, strings.Join(Cases(), ", "))
	}
	return string(b), nil
}

// Entry is one outstanding delivered record after a step.
type Entry struct {
	// Offset is the record's offset.
	Offset int64
	// Completed reports whether it is complete (and waits behind an
	// unfinished record).
	Completed bool
}

// Step is the result of one script line.
type Step struct {
	// Line is the 1-based line number in the script.
	Line int
	// Op is assign, deliver, complete, position, revoke or lost.
	Op string
	// Safe is the prefix safe offset after the step (the last value while
	// not owned), or watermark.Unknown before the first assign.
	Safe int64
	// Epoch is the assigned epoch (assign) or the notice's epoch (complete).
	Epoch rebalance.Epoch
	// Start is the start offset (assign).
	Start int64
	// Offsets are the delivered offsets (deliver).
	Offsets []int64
	// Offset is the completed offset (complete).
	Offset int64
	// Position is the fetcher's position (position).
	Position int64
	// Outcome is the completion's outcome (complete), or "advanced" or
	// "unchanged" (position).
	Outcome string
	// Commit is the committed offset (revoke), or watermark.Unknown for
	// nothing (lost).
	Commit int64

	// Owner is the current epoch after the step, or 0 if not owned.
	Owner rebalance.Epoch
	// Queue is the outstanding delivered records after the step.
	Queue []Entry
	// Naive is the naive strategy's offset after the step (watermark.Unknown
	// before the first assign); computed for both strategies.
	Naive int64
	// Note is the line's comment, if any.
	Note string
}

// Violation is a step after which the naive offset would commit past
// delivered records that are not complete.
type Violation struct {
	// Line is the complete step's line.
	Line int
	// UnsafeOffset is the naive offset.
	UnsafeOffset int64
	// Skipped are the delivered, incomplete offsets below it, ascending.
	Skipped []int64
}

// Trace is the result of running a script.
type Trace struct {
	// Strategy is the strategy the trace checked.
	Strategy Strategy
	// Steps has one entry per operation.
	Steps []Step
	// Safe is the safe offset after the last step, or watermark.Unknown.
	Safe int64
	// Violations lists the naive strategy's unsafe commits; empty for Prefix.
	Violations []Violation
}

// tp is the lab's one partition.
var tp = rebalance.TP{Topic: "lab", Partition: 0}

// Run replays the script read from r and returns its trace, or a
// [*ScriptError] for the first malformed line, or the reader's error.
func Run(r io.Reader, strategy Strategy) (*Trace, error) {
	s := &state{
		table: rebalance.NewTable(),
		trace: &Trace{Strategy: strategy, Safe: watermark.Unknown, Violations: []Violation{}},
		naive: watermark.Unknown,
	}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text, note, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if err := s.step(line, fields[0], fields[1:], strings.TrimSpace(note)); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("lab: reading the script after line %d: %w", line, err)
	}
	return s.trace, nil
}

// state is a script run in progress.
type state struct {
	table *rebalance.Table
	p     *rebalance.Partition // nil before the first assign
	trace *Trace
	naive int64 // max(completed)+1 over notices received while owned, reset to START on assign
}

func (s *state) step(line int, op string, args []string, note string) error {
	bad := func(format string, a ...any) error {
		return &ScriptError{Line: line, Msg: op + ": " + fmt.Sprintf(format, a...)}
	}
	st := Step{Line: line, Op: op, Commit: watermark.Unknown, Note: note}
	switch op {
	case "assign":
		if len(args) != 2 {
			return bad("want 2 arguments, EPOCH START; got %d", len(args))
		}
		epoch, err := parseEpoch(args[0])
		if err != nil {
			return bad("bad epoch: %v", err)
		}
		start, err := parseOffset(args[1])
		if err != nil {
			return bad("bad start: %v", err)
		}
		p, err := s.table.AssignEpoch(tp, rebalance.Epoch(epoch), start)
		if err != nil {
			var ee *rebalance.EpochError
			if errors.As(err, &ee) && ee.Last == 0 {
				return bad("epoch %d must be at least 1", epoch)
			}
			return bad("epoch %d is not greater than the previous epoch %d", epoch, ee.Last)
		}
		s.p, s.naive = p, start
		st.Epoch, st.Start = p.Epoch(), start

	case "deliver":
		if len(args) == 0 {
			return bad("want at least one offset")
		}
		offs := make([]int64, len(args))
		for i, a := range args {
			off, err := parseOffset(a)
			if err != nil {
				return bad("bad offset: %v", err)
			}
			offs[i] = off
		}
		if s.p == nil || !s.p.Owned() {
			return bad("the partition is not owned")
		}
		for _, off := range offs {
			if err := s.p.Deliver(off); err != nil {
				return bad("%s", deliverMsg(off, s.p.Tracker()))
			}
		}
		st.Offsets = offs

	case "complete":
		if len(args) != 1 && len(args) != 2 {
			return bad("want OFFSET [EPOCH]; got %d arguments", len(args))
		}
		off, err := parseOffset(args[0])
		if err != nil {
			return bad("bad offset: %v", err)
		}
		var epoch rebalance.Epoch
		if s.p != nil {
			epoch = s.p.Epoch()
		}
		if len(args) == 2 {
			e, err := parseEpoch(args[1])
			if err != nil {
				return bad("bad epoch: %v", err)
			}
			epoch = rebalance.Epoch(e)
		}
		owned := s.p != nil && s.p.Owned()
		st.Offset, st.Epoch = off, epoch
		st.Outcome = s.table.Complete(tp, epoch, off).String()
		if owned {
			s.naive = max(s.naive, off+1)
		}

	case "position":
		if len(args) != 1 {
			return bad("want 1 argument, POS; got %d", len(args))
		}
		pos, err := parseOffset(args[0])
		if err != nil {
			return bad("bad position: %v", err)
		}
		st.Position, st.Outcome = pos, "unchanged"
		if s.p != nil && s.p.Owned() {
			if last := s.p.Tracker().Last(); pos <= last {
				return bad("position %d is not above the last delivered offset %d", pos, last)
			}
			if s.p.Position(s.p.Epoch(), pos) {
				st.Outcome = "advanced"
			}
		}

	case "revoke", "lost":
		if len(args) != 0 {
			return bad("takes no arguments; got %d", len(args))
		}
		if op == "revoke" {
			final, ok := s.table.Revoke(tp)
			if !ok {
				return bad("the partition is not owned")
			}
			st.Commit = final
		} else {
			s.table.Lose(tp)
		}

	default:
		return &ScriptError{Line: line, Msg: fmt.Sprintf("unknown op %q (want assign, deliver, complete, position, revoke or lost)", op)}
	}

	st.Safe, st.Naive = watermark.Unknown, s.naive
	if s.p != nil {
		st.Safe = s.p.Safe()
		t := s.p.Tracker()
		for i := range t.Outstanding() {
			off, done := t.At(i)
			st.Queue = append(st.Queue, Entry{Offset: off, Completed: done})
		}
		if s.p.Owned() {
			st.Owner = s.p.Epoch()
		}
	}
	s.trace.Steps = append(s.trace.Steps, st)
	s.trace.Safe = st.Safe

	if op == "complete" && s.trace.Strategy == Naive && st.Owner != 0 && s.naive > st.Safe {
		var skipped []int64
		for _, e := range st.Queue {
			if !e.Completed && e.Offset < s.naive {
				skipped = append(skipped, e.Offset)
			}
		}
		if len(skipped) > 0 {
			s.trace.Violations = append(s.trace.Violations, Violation{Line: line, UnsafeOffset: s.naive, Skipped: skipped})
		}
	}
	return nil
}

// deliverMsg explains why the tracker refused off.
func deliverMsg(off int64, t *watermark.Tracker) string {
	if last := t.Last(); last != watermark.Unknown && off <= last {
		return fmt.Sprintf("offset %d is not greater than the previous delivered offset %d", off, last)
	}
	if off < t.Start() {
		return fmt.Sprintf("offset %d is below the start %d", off, t.Start())
	}
	return fmt.Sprintf("offset %d is below the safe offset %d (the position moved it)", off, t.Safe())
}

// parseOffset parses a Kafka offset: a decimal in [0, 2^63-1).
func parseOffset(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n == math.MaxInt64 {
		return 0, fmt.Errorf("%q is not an offset (a whole number from 0 to 2^63-2)", s)
	}
	return n, nil
}

// parseEpoch parses an epoch: a decimal uint64.
func parseEpoch(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an epoch (a whole number from 0)", s)
	}
	return n, nil
}
