package franz

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/runner"
)

// The source's part of the memory bound (runner.MaxBufferedBytes).
//
// franz-go decodes a whole fetch response as it arrives: the response as
// read, the decompressed batches, and one kgo.Record per record, whose key
// and value point into those buffers. The adapter makes one runner.Record
// of each record of a poll, pointing into the same buffers, and keeps
// deep copies of the records it parks. So what the source holds is at most
//
//	held <= 2k * max(F, M) * E + parked
//	E     = 1 + C + C * (sizeof(kgo.Record) + sizeof(runner.Record)) / S
//	      = 1 + C + C * 296 / S          (Go 1.26, amd64)
//
// with k the concurrent fetches (MaxConcurrentFetches: each in flight or
// buffered in the client, and as many again taken by the poll being handed
// over, whose slots the client has already reused), F the fetch size
// (FetchMaxBytes), M the largest record batch (a broker returns the first
// batch whole even if it exceeds the fetch size, KIP-74), C the largest
// compression ratio and S the smallest record (RecordShape), and parked at
// most parkShare of the share. LimitFetch solves it for F.

// defaultConcurrentFetches is k, MaxConcurrentFetches unless ClientOptions
// sets it: the fetches the client may have in flight or buffered at once.
// The memory bound must count every one of them, so every fetch gets 1/2k
// of the share; but fewer slots than brokers leading the member's
// partitions starve the busy brokers: franz-go hands the slots out in
// order, and a broker with nothing new holds one for FetchMaxWait. Three
// covers a three-broker cluster (the smallest with replication factor 3)
// with no starvation; on one broker only one fetch is ever out, so the
// bound holds with room to spare.
const defaultConcurrentFetches = 3

// parkShare is the part of FetchLimits.Bytes for parked records (see
// park); the rest sizes the client's fetches.
const parkShare = 0.125

// recordStructs is what one record costs in structures while a poll is
// handed over: its kgo.Record and its runner.Record.
const recordStructs = int64(unsafe.Sizeof(kgo.Record{}) + unsafe.Sizeof(runner.Record{}))

// minFetchBytes is the least fetch size LimitFetch accepts.
const minFetchBytes = 1 << 10

// maxFetchBytes caps a derived fetch size at franz-go's default
// FetchMaxBytes: fetching more at once buys nothing.
const maxFetchBytes = 50 << 20

// expansion is E: the bytes in memory per byte fetched, for records of at
// least minBytes compressed at most c times.
func expansion(minBytes int, c float64) float64 {
	return 1 + c + c*float64(recordStructs)/float64(minBytes)
}

// LimitFetch sizes the client's fetches so that what the source holds for
// records stays within l.Bytes, under l's assumptions (see the formula
// above): FetchMaxBytes = (1-parkShare) * l.Bytes / (2k * E), and
// FetchMaxPartitionBytes = l.PartitionBytes / l.MaxCompression, at most
// FetchMaxBytes, so that a resumed partition's first fetch fits the room
// the runner gives it. Parked records get parkShare of l.Bytes. It
// replaces any kgo.FetchMaxBytes and kgo.FetchMaxPartitionBytes given in
// ClientOptions. runner.New calls it once, before Run; it returns an error
// when l leaves fetches smaller than 1 KiB, or after Run started.
func (s *Source) LimitFetch(l runner.FetchLimits) error {
	switch {
	case s.started.Load():
		return errors.New("franz: LimitFetch after Run")
	case l.Bytes <= 0 || l.PartitionBytes <= 0:
		return fmt.Errorf("franz: fetch limits need positive bytes, got %d and %d per partition", l.Bytes, l.PartitionBytes)
	case l.MinRecordBytes < 1 || l.MaxCompression < 1:
		return fmt.Errorf("franz: fetch limits need records of at least 1 byte compressed at least 1x, got %d and %g", l.MinRecordBytes, l.MaxCompression)
	}
	e := expansion(l.MinRecordBytes, l.MaxCompression)
	park := int64(float64(l.Bytes) * parkShare)
	k := max(s.fetches, 1) // 0: one fetch, only while polling
	fetch := float64(l.Bytes-park) / (2 * float64(k) * e)
	if fetch < minFetchBytes {
		return fmt.Errorf("franz: the source's share of MaxBufferedBytes, %d bytes, leaves fetches of %.0f bytes "+
			"(%d concurrent fetches, each expanding up to %.1f times in memory for records of at least %d bytes compressed up to %gx); "+
			"at least %d are needed: raise MaxBufferedBytes, or lower kgo.MaxConcurrentFetches", l.Bytes, fetch, k, e, l.MinRecordBytes, l.MaxCompression, minFetchBytes)
	}
	fetch = min(fetch, maxFetchBytes)
	part := min(fetch, max(float64(l.PartitionBytes)/l.MaxCompression, minFetchBytes))
	s.heldMu.Lock()
	s.parkLimit = park
	s.heldMu.Unlock()
	s.limits.Store(&fetchLimits{maxBytes: int32(fetch), partBytes: int32(part), expansion: e})
	s.cl.UpdateFetchMaxBytes(int32(fetch), int32(part))
	s.log.Info("fetch sizes derived from the memory bound", "share_bytes", l.Bytes, "fetch_max_bytes", int32(fetch),
		"fetch_max_partition_bytes", int32(part), "concurrent_fetches", k, "expansion", math.Round(e*10)/10, "parked_bytes", park)
	return nil
}

// fetchLimits are the fetch sizes LimitFetch derived, and the expansion
// they assume.
type fetchLimits struct {
	maxBytes, partBytes int32
	expansion           float64
}

// batchHeaderBytes is a v2 record batch's header on the wire, which
// kgo.FetchBatchMetrics leaves out of CompressedBytes.
const batchHeaderBytes = 61

// expansionHook watches what each fetched batch costs in memory per byte
// fetched (kgo.HookFetchBatchRead, on the client's fetch goroutines) and
// lowers the fetch sizes when a batch expands more than LimitFetch assumed
// — its records are smaller, or compressed more, than runner.RecordShape
// states — so that later fetches keep the bound with the expansion seen.
// It only ever lowers them: raising them on larger records would break the
// bound when small ones come back, within the stated shape. It logs the
// first time.
type expansionHook struct{ s *Source }

func (h expansionHook) OnFetchBatchRead(_ kgo.BrokerMetadata, topic string, partition int32, m kgo.FetchBatchMetrics) {
	l := h.s.limits.Load()
	if l == nil || m.NumRecords == 0 || m.CompressedBytes <= 0 {
		return
	}
	mem := float64(m.CompressedBytes) + float64(int64(m.NumRecords)*recordStructs)
	if m.CompressionType != 0 {
		mem += float64(m.UncompressedBytes)
	}
	e := mem / float64(m.CompressedBytes+batchHeaderBytes)
	if e <= l.expansion {
		return
	}
	scale := l.expansion / e
	lower := &fetchLimits{
		maxBytes:  max(int32(float64(l.maxBytes)*scale), minFetchBytes),
		partBytes: max(int32(float64(l.partBytes)*scale), minFetchBytes),
		expansion: e,
	}
	lower.partBytes = min(lower.partBytes, lower.maxBytes)
	if !h.s.limits.CompareAndSwap(l, lower) {
		return // another batch lowered them meanwhile; the next one checks again
	}
	h.s.cl.UpdateFetchMaxBytes(lower.maxBytes, lower.partBytes)
	if h.s.lowered.CompareAndSwap(false, true) {
		h.s.log.Warn("fetched records are smaller, or compressed more, than runner.RecordShape states; fetch sizes lowered to keep the memory bound (logged once)",
			"partition", topic+"/"+strconv.Itoa(int(partition)), "records", m.NumRecords, "bytes", m.CompressedBytes,
			"uncompressed_bytes", m.UncompressedBytes, "expansion", math.Round(e*10)/10, "fetch_max_bytes", lower.maxBytes)
	}
}
