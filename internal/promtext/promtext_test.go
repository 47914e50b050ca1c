package promtext_test

import (
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/promtext"
)

func TestSum(t *testing.T) {
	page := `# HELP tidemark_records_fenced_total fenced
# TYPE tidemark_records_fenced_total counter
tidemark_records_fenced_total{topic="a b",partition="0"} 2
tidemark_records_fenced_total{topic="a",partition="1"} 3.5
tidemark_ready 1
broken_line_without_value
bad_value NaNx
`
	got, err := promtext.Sum(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got["tidemark_records_fenced_total"] != 5.5 || got["tidemark_ready"] != 1 || len(got) != 2 {
		t.Fatalf("Sum = %v, want fenced 5.5 and ready 1 only", got)
	}
}
