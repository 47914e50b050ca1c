package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// offsetJSON is an offset that is null when Unknown.
type offsetJSON int64

func (o offsetJSON) MarshalJSON() ([]byte, error) {
	if int64(o) == watermark.Unknown {
		return []byte("null"), nil
	}
	return strconv.AppendInt(nil, int64(o), 10), nil
}

// MarshalJSON encodes the step with the fields of its op: line, op, then
// epoch and start (assign), offsets (deliver), offset, epoch and outcome
// (complete), position and outcome (position), commit (revoke; null for
// lost), and safe (null before the first assign).
func (s Step) MarshalJSON() ([]byte, error) {
	type base struct {
		Line int    `json:"line"`
		Op   string `json:"op"`
	}
	b := base{s.Line, s.Op}
	safe := offsetJSON(s.Safe)
	switch s.Op {
	case "assign":
		return json.Marshal(struct {
			base
			Epoch uint64     `json:"epoch"`
			Start int64      `json:"start"`
			Safe  offsetJSON `json:"safe"`
		}{b, uint64(s.Epoch), s.Start, safe})
	case "deliver":
		return json.Marshal(struct {
			base
			Offsets []int64    `json:"offsets"`
			Safe    offsetJSON `json:"safe"`
		}{b, s.Offsets, safe})
	case "complete":
		return json.Marshal(struct {
			base
			Offset  int64      `json:"offset"`
			Epoch   uint64     `json:"epoch"`
			Outcome string     `json:"outcome"`
			Safe    offsetJSON `json:"safe"`
		}{b, s.Offset, uint64(s.Epoch), s.Outcome, safe})
	case "position":
		return json.Marshal(struct {
			base
			Position int64      `json:"position"`
			Outcome  string     `json:"outcome"`
			Safe     offsetJSON `json:"safe"`
		}{b, s.Position, s.Outcome, safe})
	default: // revoke, lost
		return json.Marshal(struct {
			base
			Commit offsetJSON `json:"commit"`
			Safe   offsetJSON `json:"safe"`
		}{b, offsetJSON(s.Commit), safe})
	}
}

// MarshalJSON encodes the violation as {"line", "unsafe_offset", "skipped"}.
func (v Violation) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Line         int     `json:"line"`
		UnsafeOffset int64   `json:"unsafe_offset"`
		Skipped      []int64 `json:"skipped"`
	}{v.Line, v.UnsafeOffset, v.Skipped})
}

// MarshalJSON encodes the trace as {"strategy", "steps", "safe",
// "violations"}; steps and violations are arrays, never null.
func (t *Trace) MarshalJSON() ([]byte, error) {
	steps, violations := t.Steps, t.Violations
	if steps == nil {
		steps = []Step{}
	}
	if violations == nil {
		violations = []Violation{}
	}
	return json.Marshal(struct {
		Strategy   string      `json:"strategy"`
		Steps      []Step      `json:"steps"`
		Safe       offsetJSON  `json:"safe"`
		Violations []Violation `json:"violations"`
	}{t.Strategy.String(), steps, offsetJSON(t.Safe), violations})
}

// WriteJSON writes the trace as indented JSON and a newline.
func (t *Trace) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteTable writes the trace as a table for people: one row per step with
// the partition's owner epoch, the step, its outcome, the safe offset after
// it, the outstanding delivered records (✓ marks one that is complete but
// waits behind an unfinished one) and the script line's comment, then a
// legend. With the naive strategy a column shows the naive offset, a "!"
// marks the steps where it is unsafe, and each violation is listed.
func (t *Trace) WriteTable(w io.Writer) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	naive := t.Strategy == Naive
	bad := make(map[int]bool, len(t.Violations))
	for _, v := range t.Violations {
		bad[v.Line] = true
	}
	head := "LINE\tOWNER\tSTEP\tOUTCOME\tSAFE"
	if naive {
		head += "\tNAIVE"
	}
	fmt.Fprintln(tw, head+"\tOUTSTANDING\tNOTE")
	for _, s := range t.Steps {
		owner := "-"
		if s.Owner != 0 {
			owner = "epoch " + strconv.FormatUint(uint64(s.Owner), 10)
		}
		row := fmt.Sprintf("%d\t%s\t%s\t%s\t%s", s.Line, owner, stepText(s), outcomeText(s), offsetText(s.Safe))
		if naive {
			n := offsetText(s.Naive)
			if bad[s.Line] {
				n += " !"
			}
			row += "\t" + n
		}
		q := queueText(s.Queue)
		if s.Owner == 0 && q != "" {
			q = "(" + q + ")"
		}
		fmt.Fprintln(tw, row+"\t"+q+"\t"+s.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// tabwriter pads empty trailing cells; drop the trailing blanks.
	lines := strings.SplitAfter(buf.String(), "\n")
	buf.Reset()
	for _, l := range lines {
		trimmed := strings.TrimRight(l, " \n")
		buf.WriteString(trimmed)
		if len(trimmed) < len(l) && strings.HasSuffix(l, "\n") {
			buf.WriteByte('\n')
		}
	}
	fmt.Fprintf(&buf, "\nsafe offset after the last step: %s\n", offsetText(t.Safe))
	if naive {
		if len(t.Violations) == 0 {
			buf.WriteString("the naive max(completed)+1 rule never skipped an unfinished record here\n")
		}
		for _, v := range t.Violations {
			fmt.Fprintf(&buf, "line %d: naive would commit %d, skipping unfinished %s\n", v.Line, v.UnsafeOffset, joinOffsets(v.Skipped))
		}
	}
	buf.WriteString(`
SAFE is the offset to commit: one past the contiguous completed prefix of the
delivered records. OUTSTANDING lists the delivered records not yet below it,
oldest first; ✓ marks a record that is complete but waits behind an
unfinished one; in parentheses, records of an ended epoch, which the next
owner replays. OWNER is the current epoch, or - when the partition is not
owned.
`)
	_, err := w.Write(buf.Bytes())
	return err
}

func stepText(s Step) string {
	switch s.Op {
	case "assign":
		return fmt.Sprintf("assign epoch %d from %d", s.Epoch, s.Start)
	case "deliver":
		return "deliver " + joinOffsets(s.Offsets)
	case "complete":
		return fmt.Sprintf("complete %d (epoch %d)", s.Offset, s.Epoch)
	case "position":
		return fmt.Sprintf("position %d", s.Position)
	}
	return s.Op
}

func outcomeText(s Step) string {
	switch s.Op {
	case "revoke":
		return "commit " + offsetText(s.Commit)
	case "lost":
		return "commit nothing"
	}
	return s.Outcome
}

func offsetText(o int64) string {
	if o == watermark.Unknown {
		return "-"
	}
	return strconv.FormatInt(o, 10)
}

func queueText(q []Entry) string {
	parts := make([]string, len(q))
	for i, e := range q {
		parts[i] = strconv.FormatInt(e.Offset, 10)
		if e.Completed {
			parts[i] += "✓"
		}
	}
	return strings.Join(parts, " ")
}

func joinOffsets(offs []int64) string {
	parts := make([]string, len(offs))
	for i, o := range offs {
		parts[i] = strconv.FormatInt(o, 10)
	}
	return strings.Join(parts, " ")
}
