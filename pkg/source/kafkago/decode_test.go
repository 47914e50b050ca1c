package kafkago_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/compress/snappy"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/kafkago"
)

// rec is one record of a test batch: its offset delta, key, value and
// headers. A nil key or value is null on the wire.
type rec struct {
	delta      int64
	key, value []byte
	headers    []runner.Header
}

// spec is a test batch in the v2 format as a broker sends it.
type spec struct {
	base      int64
	lastDelta int32 // the header's lastOffsetDelta; -1: the last record's delta
	pid       int64
	txn       bool
	control   int16 // 0: a record batch; 1 COMMIT marker; 2 ABORT marker (type+1)
	codec     compress.Compression
	rawSnappy bool // snappy without the xerial framing (franz-go, librdkafka)
	appendTS  bool // timestamp type LogAppendTime
	epoch     int32
	recs      []rec
}

const baseTS, maxTS = 1_700_000_000_000, 1_700_000_009_999

func appendVarint(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

func appendField(b, f []byte) []byte {
	if f == nil {
		return appendVarint(b, -1)
	}
	return append(appendVarint(b, int64(len(f))), f...)
}

// encode returns s as wire bytes: the 61-byte header, then the records,
// compressed when s.codec says so, with a correct CRC-32C.
func encode(t testing.TB, s spec) []byte {
	t.Helper()
	var records []byte
	for _, r := range s.recs {
		var body []byte
		body = append(body, 0)             // attributes
		body = appendVarint(body, r.delta) // timestamp delta
		body = appendVarint(body, r.delta) // offset delta
		body = appendField(body, r.key)    // key
		body = appendField(body, r.value)  // value
		body = appendVarint(body, int64(len(r.headers)))
		for _, h := range r.headers {
			body = appendField(body, []byte(h.Key))
			body = appendField(body, h.Value)
		}
		records = append(appendVarint(records, int64(len(body))), body...)
	}
	if s.codec != compress.None {
		var buf bytes.Buffer
		codec := s.codec.Codec()
		if s.rawSnappy {
			codec = &snappy.Codec{Framing: snappy.Unframed}
		}
		w := codec.NewWriter(&buf)
		if _, err := w.Write(records); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		records = buf.Bytes()
	}
	last := s.lastDelta
	if last < 0 && len(s.recs) > 0 {
		last = int32(s.recs[len(s.recs)-1].delta)
	}
	attrs := int16(s.codec)
	if s.appendTS {
		attrs |= 0x08
	}
	if s.txn {
		attrs |= 0x10
	}
	if s.control != 0 {
		attrs |= 0x20
	}
	b := binary.BigEndian.AppendUint64(nil, uint64(s.base))
	b = binary.BigEndian.AppendUint32(b, uint32(49+len(records)))
	b = binary.BigEndian.AppendUint32(b, uint32(s.epoch))
	b = append(b, 2)
	b = binary.BigEndian.AppendUint32(b, 0) // crc, below
	b = binary.BigEndian.AppendUint16(b, uint16(attrs))
	b = binary.BigEndian.AppendUint32(b, uint32(last))
	b = binary.BigEndian.AppendUint64(b, baseTS)
	b = binary.BigEndian.AppendUint64(b, maxTS)
	b = binary.BigEndian.AppendUint64(b, uint64(s.pid))
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.recs)))
	b = append(b, records...)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// batch is a record batch of producer pid with records at offsets offs
// (transactional when txn), keys "k" and one-byte values.
func batch(t testing.TB, pid int64, txn bool, offs ...int64) []byte {
	s := spec{base: offs[0], lastDelta: -1, pid: pid, txn: txn}
	for _, o := range offs {
		s.recs = append(s.recs, rec{delta: o - offs[0], key: []byte("k"), value: []byte{byte(o)}})
	}
	return encode(t, s)
}

// marker is a transaction marker of producer pid at offset: a commit when
// commit, an abort otherwise.
func marker(t testing.TB, pid, offset int64, commit bool) []byte {
	typ := byte(0)
	if commit {
		typ = 1
	}
	return encode(t, spec{base: offset, lastDelta: 0, pid: pid, txn: true, control: 1,
		recs: []rec{{key: []byte{0, 0, 0, typ}, value: []byte{0, 0, 0, 0, 0, 0}}}})
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func offsetsOf(recs []runner.Record) []int64 {
	var out []int64
	for _, r := range recs {
		out = append(out, r.Offset)
	}
	return out
}

// TestDecode checks what the adapter reads from a fetch answer's record
// batches: read_committed filtering (kafka-go's Reader does none), the
// next fetch offset moving past markers, aborted records and — by each
// batch's last offset — offsets compaction removed, so the committed offset
// can reach the end of the log.
func TestDecode(t *testing.T) {
	t.Parallel()
	tp := runner.TP{Topic: "t", Partition: 3}
	tests := []struct {
		name    string
		records []byte
		aborted [][2]int64 // producer id, first offset
		from    int64
		want    []int64
		wantEnd int64
	}{
		{
			name:    "plain records",
			records: cat(batch(t, -1, false, 0, 1, 2), batch(t, -1, false, 3, 4)),
			want:    []int64{0, 1, 2, 3, 4},
			wantEnd: 5,
		},
		{
			name:    "records before the fetch offset are skipped",
			records: batch(t, -1, false, 10, 11, 12, 13),
			from:    12,
			want:    []int64{12, 13},
			wantEnd: 14,
		},
		{
			// The regression: the cleaner removed offsets 13-19 from a
			// batch spanning 10-19 and kept its header. A fetch at 13
			// answers with this batch; its last offset, not its last
			// record, is where the next fetch starts.
			name: "a compacted batch's removed tail",
			records: encode(t, spec{base: 10, lastDelta: 9, recs: []rec{
				{delta: 0, key: []byte("a"), value: []byte("x")}, {delta: 1, key: []byte("b")}, {delta: 2, key: []byte("c")}}}),
			from:    13,
			want:    nil,
			wantEnd: 20,
		},
		{
			name: "compaction gaps inside and after",
			records: cat(encode(t, spec{base: 0, lastDelta: 7, recs: []rec{{delta: 0, key: []byte("a")}, {delta: 5, key: []byte("b")}}}),
				encode(t, spec{base: 8, lastDelta: 3, recs: []rec{{delta: 2, key: []byte("c")}}})),
			want:    []int64{0, 5, 10},
			wantEnd: 12,
		},
		{
			name:    "an empty batch the cleaner kept for its producer",
			records: encode(t, spec{base: 30, lastDelta: 4, pid: 9}),
			from:    30,
			want:    nil,
			wantEnd: 35,
		},
		{
			name:    "committed then aborted, ending on an abort marker",
			records: cat(batch(t, 7, true, 0, 1, 2), marker(t, 7, 3, true), batch(t, 7, true, 4, 5, 6), marker(t, 7, 7, false)),
			aborted: [][2]int64{{7, 4}},
			want:    []int64{0, 1, 2},
			wantEnd: 8,
		},
		{
			name: "only the aborted producer's batches are dropped",
			records: cat(batch(t, 7, true, 0, 1), batch(t, 8, true, 2, 3), batch(t, -1, false, 4),
				marker(t, 7, 5, false), marker(t, 8, 6, true)),
			aborted: [][2]int64{{7, 0}},
			want:    []int64{2, 3, 4},
			wantEnd: 7,
		},
		{
			name:    "a producer is live again after its abort marker",
			records: cat(batch(t, 7, true, 0, 1), marker(t, 7, 2, false), batch(t, 7, true, 3, 4), marker(t, 7, 5, true)),
			aborted: [][2]int64{{7, 0}},
			want:    []int64{3, 4},
			wantEnd: 6,
		},
		{
			name:    "only markers",
			records: cat(marker(t, 7, 9, true), marker(t, 8, 10, false)),
			from:    9,
			want:    nil,
			wantEnd: 11,
		},
		{
			name:    "a last batch cut short waits for the next fetch",
			records: cat(batch(t, -1, false, 0, 1), batch(t, -1, false, 2, 3)[:40]),
			want:    []int64{0, 1},
			wantEnd: 2,
		},
		{
			name:    "nothing fetched",
			from:    42,
			want:    nil,
			wantEnd: 42,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, end, err := kafkago.Decode(tp, tc.records, tc.aborted, tc.from)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got := offsetsOf(recs); !slices.Equal(got, tc.want) {
				t.Errorf("delivered offsets %v, want %v", got, tc.want)
			}
			if end != tc.wantEnd {
				t.Errorf("next fetch offset %d, want %d", end, tc.wantEnd)
			}
			for _, r := range recs {
				if r.Topic != tp.Topic || r.Partition != tp.Partition {
					t.Errorf("record %s is not of %s", r.String(), tp)
				}
			}
		})
	}
}

// TestDecodeFields checks each field of a record, through every codec:
// null and empty keys and values stay apart, headers keep their order,
// timestamps follow the batch's timestamp type, the leader epoch is the
// batch's.
func TestDecodeFields(t *testing.T) {
	t.Parallel()
	tp := runner.TP{Topic: "t", Partition: 0}
	hs := []runner.Header{{Key: "h1", Value: []byte("v1")}, {Key: "h2", Value: nil}, {Key: "h1", Value: []byte{}}}
	recs := []rec{
		{delta: 0, key: []byte("key"), value: []byte("value"), headers: hs},
		{delta: 1, key: nil, value: nil},
		{delta: 2, key: []byte{}, value: []byte{}},
		{delta: 3, key: []byte("big"), value: bytes.Repeat([]byte("0123456789"), 10_000)}, // xerial: several blocks
	}
	codecs := []struct {
		name      string
		codec     compress.Compression
		rawSnappy bool
	}{
		{"none", compress.None, false}, {"gzip", compress.Gzip, false}, {"snappy-xerial", compress.Snappy, false},
		{"snappy-raw", compress.Snappy, true}, {"lz4", compress.Lz4, false}, {"zstd", compress.Zstd, false},
	}
	for _, cc := range codecs {
		for _, appendTS := range []bool{false, true} {
			t.Run(cc.name, func(t *testing.T) {
				b := encode(t, spec{base: 100, lastDelta: -1, codec: cc.codec, rawSnappy: cc.rawSnappy, appendTS: appendTS, epoch: 7, recs: recs})
				got, end, err := kafkago.Decode(tp, b, nil, 0)
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				if end != 104 || len(got) != len(recs) {
					t.Fatalf("%d records, next offset %d; want %d and 104", len(got), end, len(recs))
				}
				for i, r := range got {
					w := recs[i]
					if r.Offset != 100+w.delta || r.LeaderEpoch != 7 {
						t.Errorf("record %d: offset %d epoch %d", i, r.Offset, r.LeaderEpoch)
					}
					if !bytes.Equal(r.Key, w.key) || (r.Key == nil) != (w.key == nil) {
						t.Errorf("record %d: key %q (nil %v), want %q (nil %v)", i, r.Key, r.Key == nil, w.key, w.key == nil)
					}
					if !bytes.Equal(r.Value, w.value) || (r.Value == nil) != (w.value == nil) {
						t.Errorf("record %d: value of %d bytes (nil %v), want %d (nil %v)", i, len(r.Value), r.Value == nil, len(w.value), w.value == nil)
					}
					if len(r.Headers) != len(w.headers) {
						t.Fatalf("record %d: %d headers, want %d", i, len(r.Headers), len(w.headers))
					}
					for j, h := range r.Headers {
						if h.Key != w.headers[j].Key || !bytes.Equal(h.Value, w.headers[j].Value) || (h.Value == nil) != (w.headers[j].Value == nil) {
							t.Errorf("record %d header %d: %q=%q, want %q=%q", i, j, h.Key, h.Value, w.headers[j].Key, w.headers[j].Value)
						}
					}
					ts := time.UnixMilli(baseTS + w.delta)
					if appendTS {
						ts = time.UnixMilli(maxTS)
					}
					if !r.Timestamp.Equal(ts) {
						t.Errorf("record %d: timestamp %v, want %v", i, r.Timestamp, ts)
					}
					if cap(r.Key) != len(r.Key) || cap(r.Value) != len(r.Value) {
						t.Errorf("record %d: an append to its key or value would write into the next field", i)
					}
				}
			})
		}
	}
}

// TestDecodeLegacy checks a v1 message set (a log written before Kafka
// 0.11), read through kafka-go's decoder.
func TestDecodeLegacy(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	rs := protocol.RecordSet{Version: 1, Records: protocol.NewRecordReader(
		protocol.Record{Offset: 0, Key: protocol.NewBytes([]byte("a")), Value: protocol.NewBytes([]byte("1"))},
		protocol.Record{Offset: 1, Key: protocol.NewBytes([]byte("b")), Value: protocol.NewBytes([]byte("2"))},
	)}
	if _, err := rs.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	records := buf.Bytes()[4:] // without the record set's size
	got, end, err := kafkago.Decode(runner.TP{Topic: "t"}, cat(records, batch(t, -1, false, 2)), nil, 1)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !slices.Equal(offsetsOf(got), []int64{1, 2}) || end != 3 || string(got[0].Key) != "b" || string(got[0].Value) != "2" {
		t.Fatalf("offsets %v, next %d, first %q=%q; want [1 2], 3, b=2", offsetsOf(got), end, got[0].Key, got[0].Value)
	}
}

// TestDecodeCorrupt: a batch that does not check out is an error naming
// the partition and the batch, never a panic, a wrong record or a huge
// allocation.
func TestDecodeCorrupt(t *testing.T) {
	t.Parallel()
	tp := runner.TP{Topic: "t", Partition: 1}
	good := batch(t, -1, false, 5, 6, 7)
	flip := func(i int) []byte { b := slices.Clone(good); b[i] ^= 0x40; return b }
	withCRC := func(b []byte) []byte {
		binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
		return b
	}
	huge := withCRC(slices.Clone(good))
	binary.BigEndian.PutUint32(huge[57:], 1<<31-1) // records claimed
	withCRC(huge)
	overrun := withCRC(flip(61)) // first record's length
	tests := map[string][]byte{
		"checksum":         flip(70),
		"record count":     huge,
		"record length":    overrun,
		"unknown magic":    withCRC(func() []byte { b := slices.Clone(good); b[16] = 3; return b }()),
		"negative length":  func() []byte { b := slices.Clone(good); binary.BigEndian.PutUint32(b[8:], 1); return b }(),
		"header cut at 40": func() []byte { b := slices.Clone(good[:40]); binary.BigEndian.PutUint32(b[8:], 28); return b }(),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := kafkago.Decode(tp, b, nil, 0)
			var ce *kafkago.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("err %v, want a *CorruptError", err)
			}
			if ce.TP != tp || ce.Offset != 5 {
				t.Errorf("error names %s@%d, want %s@5: %v", ce.TP, ce.Offset, tp, err)
			}
		})
	}
}

// FuzzDecode: no input makes decode panic, deliver records out of order or
// before the offset asked for, or move the position backward.
func FuzzDecode(f *testing.F) {
	f.Add(cat(batch(f, -1, false, 0, 1, 2), marker(f, 7, 3, true)), int64(1))
	f.Add(encode(f, spec{base: 10, lastDelta: 9, codec: compress.Snappy, recs: []rec{{delta: 1, key: []byte("a")}}}), int64(10))
	f.Fuzz(func(t *testing.T, b []byte, from int64) {
		recs, end, err := kafkago.Decode(runner.TP{Topic: "t"}, b, [][2]int64{{7, 0}}, from)
		if err != nil {
			return
		}
		if end < from {
			t.Fatalf("position moved back from %d to %d", from, end)
		}
		for i, r := range recs {
			if r.Offset < from || r.Offset >= end || (i > 0 && r.Offset <= recs[i-1].Offset) {
				t.Fatalf("record %d at offset %d (from %d, end %d)", i, r.Offset, from, end)
			}
		}
	})
}
