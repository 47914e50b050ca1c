package kafkago

import "github.com/tidemark/tidemark/pkg/runner"

// Decode exposes decode to the external tests, with each aborted
// transaction as {producer id, first offset}.
func Decode(tp runner.TP, records []byte, aborted [][2]int64, from int64) ([]runner.Record, int64, error) {
	var a []abortedTxn
	for _, x := range aborted {
		a = append(a, abortedTxn{producerID: x[0], firstOffset: x[1]})
	}
	d, err := decode(tp, records, a, from)
	return d.recs, d.end, err
}
