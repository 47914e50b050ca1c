package kgorec_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/internal/kgorec"
)

func TestRecord(t *testing.T) {
	at := time.Unix(1700000000, 0)
	r := &kgo.Record{Topic: "t", Partition: 3, Offset: 42, Key: []byte("k"), Value: []byte{0xff, 0xfe},
		Timestamp: at, LeaderEpoch: 7, Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}, {Key: "", Value: nil}}}
	want := runner.Record{Topic: "t", Partition: 3, Offset: 42, Key: []byte("k"), Value: []byte{0xff, 0xfe},
		Timestamp: at, LeaderEpoch: 7, Headers: []runner.Header{{Key: "h", Value: []byte("v")}, {Key: "", Value: nil}}}
	if got := kgorec.Record(r); !reflect.DeepEqual(got, want) {
		t.Fatalf("Record = %+v, want %+v", got, want)
	}
	if got := kgorec.Record(&kgo.Record{Topic: "t"}); got.Headers != nil {
		t.Fatalf("no headers converted to %#v, want nil", got.Headers)
	}
}
