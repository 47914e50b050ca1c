package kafkago_test

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// batch is a record batch of producer pid at offsets offs (transactional
// when txn).
func batch(pid int64, txn bool, offs ...int64) protocol.RecordReader {
	recs := make([]protocol.Record, len(offs))
	for i, o := range offs {
		recs[i] = protocol.Record{Offset: o, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes([]byte{byte(o)})}
	}
	b := &protocol.RecordBatch{BaseOffset: offs[0], ProducerID: pid, Records: protocol.NewRecordReader(recs...)}
	if txn {
		b.Attributes = protocol.Transactional
	}
	return b
}

// marker is a transaction marker of producer pid at offset: a commit when
// commit, an abort otherwise.
func marker(pid, offset int64, commit bool) protocol.RecordReader {
	typ := int16(0)
	if commit {
		typ = 1
	}
	cb := protocol.NewControlBatch(protocol.ControlRecord{Offset: offset, Type: typ, Data: []byte{0, 0, 0, 0, 0, 0}})
	cb.BaseOffset, cb.ProducerID = offset, pid
	cb.Attributes = protocol.Control | protocol.Transactional
	return cb
}

func part(aborted []fetchapi.ResponseTransaction, batches ...protocol.RecordReader) *fetchapi.ResponsePartition {
	return &fetchapi.ResponsePartition{
		AbortedTransactions: aborted,
		RecordSet:           protocol.RecordSet{Version: 2, Records: &protocol.RecordStream{Records: batches}},
	}
}

func offsetsOf(recs []runner.Record) []int64 {
	var out []int64
	for _, r := range recs {
		out = append(out, r.Offset)
	}
	return out
}

// TestDecode checks the read_committed filtering the adapter does itself
// because kafka-go's Reader does not: transaction markers and the records
// of aborted transactions are never delivered, and the next fetch offset
// moves past both, so the committed offset can reach the end of the log.
func TestDecode(t *testing.T) {
	tp := runner.TP{Topic: "t", Partition: 3}
	tests := []struct {
		name    string
		part    *fetchapi.ResponsePartition
		from    int64
		want    []int64
		wantEnd int64
	}{
		{
			name:    "plain records",
			part:    part(nil, batch(-1, false, 0, 1, 2), batch(-1, false, 3, 4)),
			want:    []int64{0, 1, 2, 3, 4},
			wantEnd: 5,
		},
		{
			name:    "records before the fetch offset are skipped",
			part:    part(nil, batch(-1, false, 10, 11, 12, 13)),
			from:    12,
			want:    []int64{12, 13},
			wantEnd: 14,
		},
		{
			name: "committed then aborted, ending on an abort marker",
			part: part([]fetchapi.ResponseTransaction{{ProducerID: 7, FirstOffset: 4}},
				batch(7, true, 0, 1, 2), marker(7, 3, true),
				batch(7, true, 4, 5, 6), marker(7, 7, false)),
			want:    []int64{0, 1, 2},
			wantEnd: 8,
		},
		{
			name: "only the aborted producer's batches are dropped",
			part: part([]fetchapi.ResponseTransaction{{ProducerID: 7, FirstOffset: 0}},
				batch(7, true, 0, 1), batch(8, true, 2, 3), batch(-1, false, 4),
				marker(7, 5, false), marker(8, 6, true)),
			want:    []int64{2, 3, 4},
			wantEnd: 7,
		},
		{
			name: "a producer is live again after its abort marker",
			part: part([]fetchapi.ResponseTransaction{{ProducerID: 7, FirstOffset: 0}},
				batch(7, true, 0, 1), marker(7, 2, false),
				batch(7, true, 3, 4), marker(7, 5, true)),
			want:    []int64{3, 4},
			wantEnd: 6,
		},
		{
			name:    "only markers",
			part:    part(nil, marker(7, 9, true), marker(8, 10, false)),
			from:    9,
			want:    nil,
			wantEnd: 11,
		},
		{
			name:    "nothing fetched",
			part:    &fetchapi.ResponsePartition{},
			from:    42,
			want:    nil,
			wantEnd: 42,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, end, _ := kafkago.Decode(tp, tc.part, tc.from)
			if got := offsetsOf(recs); !slices.Equal(got, tc.want) {
				t.Errorf("delivered offsets %v, want %v", got, tc.want)
			}
			if end != tc.wantEnd {
				t.Errorf("next fetch offset %d, want %d", end, tc.wantEnd)
			}
			for _, r := range recs {
				if r.Topic != tp.Topic || r.Partition != tp.Partition || string(r.Key) != "k" || len(r.Value) != 1 || r.Value[0] != byte(r.Offset) {
					t.Errorf("record %s has key %q value %v", r.String(), r.Key, r.Value)
				}
			}
		})
	}
}
