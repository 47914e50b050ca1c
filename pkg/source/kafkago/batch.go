package kafkago

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
	"unsafe"

	"github.com/klauspost/compress/snappy"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/tidemark/tidemark/pkg/runner"
)

// The v2 record batch (KIP-98), as a broker stores and sends it:
//
//	offset  size  field
//	0       8     baseOffset
//	8       4     batchLength (bytes after this field)
//	12      4     partitionLeaderEpoch
//	16      1     magic (2)
//	17      4     crc (CRC-32C of everything from attributes on)
//	21      2     attributes (compression 0-2, timestamp type 3, transactional 4, control 5)
//	23      4     lastOffsetDelta
//	27      8     baseTimestamp
//	35      8     maxTimestamp
//	43      8     producerId
//	51      2     producerEpoch
//	53      4     baseSequence
//	57      4     recordCount
//	61            records, compressed as a whole when attributes say so
//
// v0 and v1 message sets share the first 17 bytes' layout (offset, size,
// crc, magic), which is how a reader tells them apart.
const (
	batchHeaderLen = 61
	batchPrefixLen = 17 // up to and including magic

	attrCompression   = 0x07
	attrLogAppendTime = 0x08
	attrTransactional = 0x10
	attrControl       = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordOverhead is what the adapter keeps per record besides the bytes of
// its key, value and headers: the runner.Record itself. headerOverhead is
// the same per header (the runner.Header; its key is copied too).
const (
	recordOverhead = int64(unsafe.Sizeof(runner.Record{}))
	headerOverhead = int64(unsafe.Sizeof(runner.Header{}))
)

// decoded is what one partition's fetch answer brought.
type decoded struct {
	recs []runner.Record
	// end is the next fetch offset: past every batch seen whole, by its
	// last offset, so it moves over transaction markers, aborted records
	// and offsets compaction removed.
	end int64
	// batches counts the batches seen whole.
	batches int
	// held is the bytes recs keep reachable: the decompressed batches and
	// the records themselves (the answer's frame comes on top).
	held int64
}

// CorruptError is a record batch the adapter cannot read: a checksum that
// does not match, a record that overruns its batch, an unknown format. The
// fetcher retries the fetch (a broker can send a bad answer once), logging
// each failure.
type CorruptError struct {
	TP     runner.TP
	Offset int64 // the batch's base offset
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("kafkago: corrupt record batch at %s@%d: %s", e.TP, e.Offset, e.Reason)
}

// decode turns one partition's record batches into the records to deliver,
// read_committed: it drops control batches (transaction markers) and the
// batches of aborted transactions, as the Java consumer does, and skips
// records before from (a batch can start before the offset asked for). A
// last batch cut short by the answer's size limit is left for the next
// fetch. Keys and values point into records (or into the decompressed
// batch); nothing is reused, so they stay valid as long as they are kept.
func decode(tp runner.TP, records []byte, aborted []abortedTxn, from int64) (out decoded, err error) {
	out.end = from
	if n := countRecords(records); n > 0 {
		out.recs = make([]runner.Record, 0, n)
	}
	defer func() { out.held += int64(cap(out.recs)) * recordOverhead }()
	aborted = slices.Clone(aborted)
	slices.SortFunc(aborted, func(a, b abortedTxn) int { return cmp.Compare(a.firstOffset, b.firstOffset) })
	var abortedPIDs map[int64]bool
	prevLast := int64(-1)
	for rest := records; len(rest) >= batchPrefixLen; {
		base := int64(binary.BigEndian.Uint64(rest))
		total := 12 + int(int32(binary.BigEndian.Uint32(rest[8:])))
		if total < batchPrefixLen {
			return out, &CorruptError{TP: tp, Offset: base, Reason: fmt.Sprintf("a batch of %d bytes", total)}
		}
		if total > len(rest) {
			break // cut short by the size limit: fetched again next time
		}
		batch := rest[:total]
		rest = rest[total:]
		out.batches++
		if magic := int8(batch[16]); magic < 2 {
			if err := decodeLegacy(tp, batch, from, &out); err != nil {
				return out, err
			}
			continue
		}
		b, err := readHeader(tp, base, batch)
		if err != nil {
			return out, err
		}
		last := base + int64(b.lastOffsetDelta)
		if base <= prevLast {
			return out, &CorruptError{TP: tp, Offset: base, Reason: fmt.Sprintf("the batch starts at or before the last offset %d of the batch before it", prevLast)}
		}
		prevLast = last
		out.end = max(out.end, last+1)
		for len(aborted) > 0 && aborted[0].firstOffset <= last {
			if abortedPIDs == nil {
				abortedPIDs = map[int64]bool{}
			}
			abortedPIDs[aborted[0].producerID] = true
			aborted = aborted[1:]
		}
		if b.attributes&attrControl != 0 {
			// Control record type 0 is ABORT: the producer's aborted
			// transaction ends here; its later batches are live again.
			if typ, ok := controlType(b.records); ok && typ == 0 {
				delete(abortedPIDs, b.producerID)
			}
			continue
		}
		if b.attributes&attrTransactional != 0 && abortedPIDs[b.producerID] {
			continue
		}
		if last < from || b.numRecords == 0 {
			continue
		}
		data := b.records
		if c := compress.Compression(b.attributes & attrCompression); c != compress.None {
			if data, err = decompress(c, data); err != nil {
				return out, &CorruptError{TP: tp, Offset: base, Reason: err.Error()}
			}
			out.held += int64(cap(data))
		}
		if err := readRecords(tp, b, data, from, &out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// header is the fixed part of a v2 record batch; records is what follows
// it, still compressed.
type header struct {
	base            int64
	leaderEpoch     int32
	attributes      int16
	lastOffsetDelta int32
	baseTimestamp   int64
	maxTimestamp    int64
	producerID      int64
	numRecords      int32
	records         []byte
}

func readHeader(tp runner.TP, base int64, batch []byte) (header, error) {
	bad := func(format string, a ...any) (header, error) {
		return header{}, &CorruptError{TP: tp, Offset: base, Reason: fmt.Sprintf(format, a...)}
	}
	if magic := int8(batch[16]); magic != 2 {
		return bad("magic %d", magic)
	}
	if len(batch) < batchHeaderLen {
		return bad("a v2 batch of %d bytes", len(batch))
	}
	if want, got := binary.BigEndian.Uint32(batch[17:]), crc32.Checksum(batch[21:], castagnoli); want != got {
		return bad("crc %#x, computed %#x", want, got)
	}
	h := header{
		base:            base,
		leaderEpoch:     int32(binary.BigEndian.Uint32(batch[12:])),
		attributes:      int16(binary.BigEndian.Uint16(batch[21:])),
		lastOffsetDelta: int32(binary.BigEndian.Uint32(batch[23:])),
		baseTimestamp:   int64(binary.BigEndian.Uint64(batch[27:])),
		maxTimestamp:    int64(binary.BigEndian.Uint64(batch[35:])),
		producerID:      int64(binary.BigEndian.Uint64(batch[43:])),
		numRecords:      int32(binary.BigEndian.Uint32(batch[57:])),
		records:         batch[batchHeaderLen:],
	}
	if h.lastOffsetDelta < 0 || h.numRecords < 0 {
		return bad("last offset delta %d, %d records", h.lastOffsetDelta, h.numRecords)
	}
	return h, nil
}

// countRecords sums the record counts of the whole v2 batches in records,
// so that decode allocates its slice once. It trusts a count only as far
// as the batch's bytes could hold that many records (at least 7 bytes
// each, uncompressed; a compressed batch rarely expands more than 16
// times): a corrupt count must not make decode allocate for records that
// are not there. Past that, decode's slice grows as records are read.
func countRecords(records []byte) int {
	n := 0
	for rest := records; len(rest) >= batchPrefixLen; {
		total := 12 + int(int32(binary.BigEndian.Uint32(rest[8:])))
		if total < batchPrefixLen || total > len(rest) {
			break // decode reports a corrupt length; a cut-short batch waits
		}
		batch := rest[:total]
		rest = rest[total:]
		// batch[22] is the low byte of the attributes.
		if batch[16] != 2 || total < batchHeaderLen || batch[22]&attrControl != 0 {
			continue // legacy batches grow the slice as they go
		}
		most := (total-batchHeaderLen)/7 + 1
		if batch[22]&attrCompression != 0 {
			most *= 16
		}
		n += min(max(int(int32(binary.BigEndian.Uint32(batch[57:]))), 0), most)
	}
	return n
}

// decompress returns the records of a compressed batch. Snappy, the
// default of franz-go and of many producers, is decoded into one buffer of
// exactly the decoded size; the other codecs go through kafka-go's pooled
// readers into a buffer at most twice what it holds.
func decompress(c compress.Compression, data []byte) ([]byte, error) {
	if c == compress.Snappy {
		return unsnappy(data)
	}
	codec := c.Codec()
	if codec == nil {
		return nil, fmt.Errorf("compression codec %d is not supported", c)
	}
	r := codec.NewReader(bytes.NewReader(data))
	defer r.Close()
	var out bytes.Buffer
	out.Grow(2 * len(data))
	if _, err := out.ReadFrom(r); err != nil {
		return nil, fmt.Errorf("%s: %w", c, err)
	}
	return out.Bytes(), nil
}

// xerialMagic starts a snappy batch in the xerial framing the Java client
// writes: the magic, two int32 versions, then blocks of an int32 length and
// a raw snappy block. Other producers write one raw snappy block.
var xerialMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

func unsnappy(data []byte) ([]byte, error) {
	var blocks [][]byte
	if bytes.HasPrefix(data, xerialMagic) && len(data) >= 16 {
		for rest := data[16:]; len(rest) > 0; {
			if len(rest) < 4 {
				return nil, errors.New("snappy: xerial block length cut short")
			}
			n := int(binary.BigEndian.Uint32(rest))
			if n > len(rest)-4 {
				return nil, errors.New("snappy: xerial block cut short")
			}
			blocks = append(blocks, rest[4:4+n])
			rest = rest[4+n:]
		}
	} else {
		blocks = [][]byte{data}
	}
	total := 0
	for _, b := range blocks {
		n, err := snappy.DecodedLen(b)
		if err != nil {
			return nil, fmt.Errorf("snappy: %w", err)
		}
		total += n
	}
	out := make([]byte, total)
	at := 0
	for _, b := range blocks {
		n, _ := snappy.DecodedLen(b)
		if _, err := snappy.Decode(out[at:at+n], b); err != nil {
			return nil, fmt.Errorf("snappy: %w", err)
		}
		at += n
	}
	return out, nil
}

// errRecord is a record that does not parse within its batch.
var errRecord = errors.New("record overruns its batch")

// varint reads one zigzag varint (Kafka's record fields) from b at *pos.
func varint(b []byte, pos *int) (int64, error) {
	v, n := binary.Varint(b[*pos:])
	if n <= 0 {
		return 0, errRecord
	}
	*pos += n
	return v, nil
}

// field reads a varint-length byte field at *pos: nil for length -1.
func field(b []byte, pos *int) ([]byte, error) {
	n, err := varint(b, pos)
	switch {
	case err != nil:
		return nil, err
	case n == -1:
		return nil, nil
	case n < 0 || n > int64(len(b)-*pos):
		return nil, errRecord
	}
	f := b[*pos : *pos+int(n) : *pos+int(n)]
	*pos += int(n)
	return f, nil
}

// readRecords appends b's records at or after from to out.recs.
// Offsets within a batch increase and stay within its header's range; a
// batch that says otherwise is corrupt, not a source of records out of
// order.
func readRecords(tp runner.TP, b header, data []byte, from int64, out *decoded) error {
	pos, prev := 0, int64(-1)
	for range b.numRecords {
		if err := readRecord(tp, b, data, &pos, &prev, from, out); err != nil {
			return &CorruptError{TP: tp, Offset: b.base, Reason: err.Error()}
		}
	}
	return nil
}

var errOffsets = errors.New("record offsets out of order or outside the batch")

func readRecord(tp runner.TP, b header, data []byte, pos *int, prev *int64, from int64, out *decoded) error {
	length, err := varint(data, pos)
	if err != nil {
		return err
	}
	if length < 0 || length > int64(len(data)-*pos) {
		return errRecord
	}
	end := *pos + int(length)
	rec := data[:end] // the record's fields may not run past its length
	p := *pos + 1     // attributes (unused)
	*pos = end
	tsDelta, err := varint(rec, &p)
	if err != nil {
		return err
	}
	offDelta, err := varint(rec, &p)
	if err != nil {
		return err
	}
	if offDelta <= *prev || offDelta > int64(b.lastOffsetDelta) {
		return errOffsets
	}
	*prev = offDelta
	offset := b.base + offDelta
	if offset < from {
		return nil
	}
	key, err := field(rec, &p)
	if err != nil {
		return err
	}
	value, err := field(rec, &p)
	if err != nil {
		return err
	}
	nh, err := varint(rec, &p)
	if err != nil {
		return err
	}
	if nh < 0 || nh > int64(end-p) {
		return errRecord
	}
	var headers []runner.Header
	if nh > 0 {
		headers = make([]runner.Header, nh)
		out.held += nh * headerOverhead
		for i := range headers {
			k, err := field(rec, &p)
			if err != nil {
				return err
			}
			v, err := field(rec, &p)
			if err != nil {
				return err
			}
			headers[i] = runner.Header{Key: string(k), Value: v}
			out.held += int64(len(k))
		}
	}
	ts := b.baseTimestamp + tsDelta
	if b.attributes&attrLogAppendTime != 0 {
		ts = b.maxTimestamp
	}
	out.recs = append(out.recs, runner.Record{
		Topic:       tp.Topic,
		Partition:   tp.Partition,
		Offset:      offset,
		Key:         key,
		Value:       value,
		Headers:     headers,
		Timestamp:   time.UnixMilli(ts),
		LeaderEpoch: b.leaderEpoch,
	})
	return nil
}

// controlType returns the type of a control batch's record (0 ABORT, 1
// COMMIT): its key is a version and a type, two int16s.
func controlType(data []byte) (int16, bool) {
	pos := 0
	length, err := varint(data, &pos)
	if err != nil || length < 0 || length > int64(len(data)-pos) {
		return 0, false
	}
	rec := data[:pos+int(length)]
	p := pos + 1
	for range 2 { // timestamp and offset deltas
		if _, err := varint(rec, &p); err != nil {
			return 0, false
		}
	}
	key, err := field(rec, &p)
	if err != nil || len(key) < 4 {
		return 0, false
	}
	return int16(binary.BigEndian.Uint16(key[2:])), true
}

// decodeLegacy decodes a v0 or v1 message set with kafka-go's reader (a
// log written before Kafka 0.11 can still hold them): they have no
// transactions and no batch header, so the position moves past the last
// record read.
func decodeLegacy(tp runner.TP, batch []byte, from int64, out *decoded) error {
	buf := make([]byte, 4+len(batch))
	binary.BigEndian.PutUint32(buf, uint32(len(batch)))
	copy(buf[4:], batch)
	var rs protocol.RecordSet
	if _, err := rs.ReadFrom(bytes.NewBuffer(buf)); err != nil {
		return &CorruptError{TP: tp, Offset: int64(binary.BigEndian.Uint64(batch)), Reason: err.Error()}
	}
	if rs.Records == nil {
		return nil
	}
	for {
		r, err := rs.Records.ReadRecord()
		if err != nil {
			return nil // io.EOF
		}
		out.end = max(out.end, r.Offset+1)
		rec := runner.Record{
			Topic: tp.Topic, Partition: tp.Partition, Offset: r.Offset,
			Key: bytesOf(r.Key), Value: bytesOf(r.Value), Timestamp: r.Time, LeaderEpoch: -1,
		}
		if r.Offset < from {
			continue
		}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, runner.Header{Key: h.Key, Value: h.Value})
		}
		out.recs = append(out.recs, rec)
		out.held += int64(len(rec.Key) + len(rec.Value))
	}
}

// bytesOf copies b (nil for a null key or value) out of kafka-go's pooled
// buffers and releases it.
func bytesOf(b protocol.Bytes) []byte {
	if b == nil {
		return nil
	}
	defer b.Close()
	out, err := protocol.ReadAll(b)
	if err != nil {
		return nil
	}
	return out
}
