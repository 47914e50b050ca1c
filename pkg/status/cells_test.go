package status_test

import (
	"html"
	"regexp"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/pkg/status"
)

var (
	headRe = regexp.MustCompile(`(?s)<th[^>]*>(.*?)</th>`)
	cellRe = regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`)
	tagRe  = regexp.MustCompile(`<[^>]*>`)
)

// text is a cell's text as a person reads it: tags dropped, entities
// decoded, spaces folded.
func text(cell string) string {
	return strings.Join(strings.Fields(html.UnescapeString(tagRe.ReplaceAllString(cell, " "))), " ")
}

// row reads the row that carries marker (its data-partition attribute)
// of the table with a column headed column, cell by column header.
func row(t *testing.T, page, column, marker string) map[string]string {
	t.Helper()
	i := strings.Index(page, ">"+column+"</th>")
	if i < 0 {
		t.Fatalf("no table with a column %q in the page", column)
	}
	first := column
	table := page[strings.LastIndex(page[:i], "<table"):]
	table = table[:strings.Index(table, "</table>")]
	head := table[:strings.Index(table, "</thead>")]
	var names []string
	for _, m := range headRe.FindAllStringSubmatch(head, -1) {
		names = append(names, text(m[1]))
	}
	j := strings.Index(table, marker)
	if j < 0 {
		t.Fatalf("table %q has no row %s", first, marker)
	}
	tr := table[j:]
	tr = tr[:strings.Index(tr, "</tr>")]
	cells := cellRe.FindAllStringSubmatch(tr, -1)
	if len(cells) != len(names) {
		t.Fatalf("row %s of table %q has %d cells for %d columns %v", marker, first, len(cells), len(names), names)
	}
	got := map[string]string{}
	for k, c := range cells {
		got[names[k]] = text(c[1])
	}
	return got
}

// TestPageShowsEveryCell: each column of the partitions table and of the
// oldest-unfinished table shows its own figure of the stats, so a cell
// dropped from the template, or fed the wrong field, fails here (the
// Chromium test checks a few of them on a real page; this checks all).
func TestPageShowsEveryCell(t *testing.T) {
	f := newFake()
	_, page := get(t, status.New(f).Handler(), "/tidemark")
	p := row(t, page, "committed", `data-partition="orders/1"`)
	for col, want := range map[string]string{
		"partition": "orders/1", "committed": "80", "safe": "90", "fetched": "99",
		"high watermark": "120", "lag": "40", "queued": "7", "in flight": "3", // queued: Buffered less InFlight
		"uncommitted": "19", "lanes": "3", "dead letters": "2", "fenced": "1", "epoch": "0",
	} {
		if p[col] != want {
			t.Errorf("partitions table, orders/1, column %q shows %q, want %q", col, p[col], want)
		}
	}
	for _, cause := range []string{"operator", "window"} {
		if !strings.Contains(p["paused"], cause) {
			t.Errorf("partitions table, orders/1, paused shows %q, want the cause %q", p["paused"], cause)
		}
	}
	o := row(t, page, "attempts", `data-partition="orders/1"`)
	for col, want := range map[string]string{"offset": "90", "state": "retrying", "attempts": "4"} {
		if o[col] != want {
			t.Errorf("oldest unfinished, orders/1, column %q shows %q, want %q", col, o[col], want)
		}
	}
	if !strings.Contains(o["last error"], "db said <script>steal()</script>") {
		t.Errorf("oldest unfinished, orders/1, last error shows %q, want the handler's error as text", o["last error"])
	}
}
