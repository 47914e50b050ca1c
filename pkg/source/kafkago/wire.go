package kafkago

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// Why the adapter reads fetch answers itself: kafka-go's decoder of record
// batches reads a batch's lastOffsetDelta and throws it away, and drops a
// fetch answer's list of aborted transactions everywhere but in the
// protocol package. The last offset is what moves a consumer past a batch
// whose last records compaction removed (the cleaner keeps the header of a
// batch it shrinks, last offset included, so a fetch at the first removed
// offset answers with that same batch again); without it a partition whose
// tail is such a batch can never be consumed to its end.
//
// So a fetch is a fetchCall: a protocol.Message that kafka.Transport routes
// like kafka-go's own fetch request (to the partition's leader, over the
// transport's pooled, authenticated connection) but that writes the request
// and reads the answer itself (protocol.RawExchanger): the request is
// encoded by kafka-go (fetchapi.Request, at the version the connection
// negotiated, v4 to v11), and the answer is read into one buffer and parsed
// here (parseFetch), record batches included (decode in batch.go).

// minFetchVersion is the oldest fetch version the adapter speaks: v4 added
// the isolation level and the aborted transactions read_committed needs.
// Kafka 4 brokers answer v4 and later only.
const minFetchVersion = 4

// maxAnswerBytes bounds the fetch answer the adapter reads into memory, as
// franz-go's BrokerMaxReadBytes does (its default): an answer is at most
// the fetch size, or one batch larger than it (KIP-74), so only a length
// gone wrong, or a batch beyond any sane max.message.bytes, comes near it.
const maxAnswerBytes = 100 << 20

// fetchCall is one fetch request sent through kafka.Transport and its
// answer. It is used for one round trip.
type fetchCall struct {
	req      fetchapi.Request
	clientID string
	version  int16 // set by Prepare: the version the connection negotiated
	answer   *fetchAnswer
}

// fetchAnswer is a fetch answer as read from the wire. frame holds the
// whole answer; every slice in it points into frame.
type fetchAnswer struct {
	frame      []byte
	errorCode  int16
	partitions []answerPartition
}

// answerPartition is one partition of a fetch answer.
type answerPartition struct {
	topic         string
	partition     int32
	errorCode     int16
	highWatermark int64
	aborted       []abortedTxn
	records       []byte // record batches as sent; the last may be cut short
}

// abortedTxn is one aborted transaction in a fetch answer's range: its
// producer and first offset.
type abortedTxn struct {
	producerID  int64
	firstOffset int64
}

var correlation atomic.Int32

func (c *fetchCall) ApiKey() protocol.ApiKey { return protocol.Fetch }

// Broker routes the request to the leader of its partition.
func (c *fetchCall) Broker(cluster protocol.Cluster) (protocol.Broker, error) {
	return c.req.Broker(cluster)
}

// Prepare records the version the connection negotiated for fetches.
func (c *fetchCall) Prepare(version int16) { c.version = version }

// Required asks for RawExchange on every connection.
func (c *fetchCall) Required(map[protocol.ApiKey]int16) bool { return true }

// RawExchange writes the request to the broker's connection and reads the
// answer. An error leaves the connection in an unknown state; kafka-go then
// closes it.
func (c *fetchCall) RawExchange(rw io.ReadWriter) (protocol.Message, error) {
	if c.version < minFetchVersion {
		return nil, fmt.Errorf("kafkago: the broker offers fetch v%d at most; read_committed needs v%d", c.version, minFetchVersion)
	}
	id := correlation.Add(1)
	if err := protocol.WriteRequest(rw, c.version, id, c.clientID, &c.req); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(rw, size[:]); err != nil {
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > maxAnswerBytes {
		return nil, fmt.Errorf("kafkago: fetch answer of %d bytes, not in [4, %d]", n, maxAnswerBytes)
	}
	frame := make([]byte, n)
	if _, err := io.ReadFull(rw, frame); err != nil {
		return nil, err
	}
	if got := int32(binary.BigEndian.Uint32(frame)); got != id {
		return nil, fmt.Errorf("kafkago: fetch answer for request %d, sent %d", got, id)
	}
	a, err := parseFetch(frame[4:], c.version)
	if err != nil {
		return nil, err
	}
	a.frame = frame
	c.answer = a
	return c, nil
}

var (
	_ protocol.RawExchanger    = (*fetchCall)(nil)
	_ protocol.BrokerMessage   = (*fetchCall)(nil)
	_ protocol.PreparedMessage = (*fetchCall)(nil)
)

// errShort is a fetch answer that ends before its fields do.
var errShort = errors.New("kafkago: fetch answer cut short")

// reader reads big-endian fields from b; the first read past its end sets
// err, and every read after it returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.err = errShort
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) int16() int16 {
	if b := r.take(2); b != nil {
		return int16(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (r *reader) int32() int32 {
	if b := r.take(4); b != nil {
		return int32(binary.BigEndian.Uint32(b))
	}
	return 0
}

func (r *reader) int64() int64 {
	if b := r.take(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

func (r *reader) string() string { return string(r.take(int(r.int16()))) }

// count reads an array length; a null array (-1) is empty.
func (r *reader) count() int {
	n := r.int32()
	if n < -1 || int(n) > len(r.b) {
		r.err = errShort
		return 0
	}
	return max(int(n), 0)
}

// parseFetch parses the body of a fetch answer of version v (4 to 11, the
// non-flexible versions), after its correlation id.
func parseFetch(b []byte, v int16) (*fetchAnswer, error) {
	r := &reader{b: b}
	a := &fetchAnswer{}
	r.int32() // throttle_time_ms
	if v >= 7 {
		a.errorCode = r.int16()
		r.int32() // session_id
	}
	for range r.count() {
		topic := r.string()
		for range r.count() {
			p := answerPartition{topic: topic}
			p.partition = r.int32()
			p.errorCode = r.int16()
			p.highWatermark = r.int64()
			r.int64() // last_stable_offset
			if v >= 5 {
				r.int64() // log_start_offset
			}
			for range r.count() {
				p.aborted = append(p.aborted, abortedTxn{producerID: r.int64(), firstOffset: r.int64()})
			}
			if v >= 11 {
				r.int32() // preferred_read_replica
			}
			if n := r.int32(); n > 0 {
				p.records = r.take(int(n))
			}
			if r.err != nil {
				return nil, r.err
			}
			a.partitions = append(a.partitions, p)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return a, nil
}
