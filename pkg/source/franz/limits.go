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
// the runner gives it. Parked records get parkShare of l.Bytes. k starts
// as MaxConcurrentFetches; once the client knows the cluster's brokers it
// is the smaller of that and their number (each broker has at most one
// fetch out or buffered at a time), and it follows the brokers as they
// come and go (see fitBrokers). It replaces any kgo.FetchMaxBytes and
// kgo.FetchMaxPartitionBytes given in ClientOptions. runner.New calls it
// once, before Run; it returns an error when l leaves fetches smaller than
// 1 KiB with MaxConcurrentFetches fetches, or after Run started.
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
	sz := fetchSizing{share: l.Bytes - park, part: float64(l.PartitionBytes) / l.MaxCompression, assumed: e}
	if fetch := sz.fetch(k, e); fetch < minFetchBytes {
		return fmt.Errorf("franz: the source's share of MaxBufferedBytes, %d bytes, leaves fetches of %.0f bytes "+
			"(%d concurrent fetches, each expanding up to %.1f times in memory for records of at least %d bytes compressed up to %gx); "+
			"at least %d are needed: raise MaxBufferedBytes, or lower kgo.MaxConcurrentFetches", l.Bytes, fetch, k, e, l.MinRecordBytes, l.MaxCompression, minFetchBytes)
	}
	s.hold.setParkLimit(park)
	s.limMu.Lock()
	s.sizing = &sz
	lim := s.resizeLocked(k, e)
	s.limMu.Unlock()
	s.log.Info("fetch sizes derived from the memory bound", "share_bytes", l.Bytes, "fetch_max_bytes", lim.maxBytes,
		"fetch_max_partition_bytes", lim.partBytes, "concurrent_fetches", k, "expansion", math.Round(e*10)/10, "parked_bytes", park)
	return nil
}

// fetchSizing is what LimitFetch was given, to size fetches again when the
// brokers or the expansion seen change.
type fetchSizing struct {
	share   int64   // FetchLimits.Bytes less the parked records' part
	part    float64 // the partition's room in fetched bytes
	assumed float64 // E under the stated record shape
}

// fetch is the fetch size for k concurrent fetches expanding e times.
func (z *fetchSizing) fetch(k int, e float64) float64 {
	return float64(z.share) / (2 * float64(k) * e)
}

// fetchLimits are the fetch sizes in force, and what they assume: k
// concurrent fetches, each expanding at most expansion times.
type fetchLimits struct {
	maxBytes, partBytes int32
	expansion           float64
	fetches             int
}

// resizeLocked derives the fetch sizes for k concurrent fetches expanding e
// times, stores them and tells the client. limMu must be held; it does no
// I/O (UpdateFetchMaxBytes stores two atomics).
func (s *Source) resizeLocked(k int, e float64) *fetchLimits {
	z := s.sizing
	fetch := max(min(z.fetch(k, e), maxFetchBytes), minFetchBytes)
	part := min(fetch, max(z.part, minFetchBytes))
	if e > z.assumed {
		// Lowered for records that expand more than stated: the
		// partition's room shrinks in the same proportion.
		part = max(min(part, z.part*z.assumed/e), minFetchBytes)
	}
	l := &fetchLimits{maxBytes: int32(fetch), partBytes: int32(part), expansion: e, fetches: k}
	s.limits.Store(l)
	s.cl.UpdateFetchMaxBytes(l.maxBytes, l.partBytes)
	return l
}

// fitBrokers sizes the fetches for the brokers the client knows: franz-go
// keeps at most one fetch out or buffered per broker, so with fewer
// brokers than MaxConcurrentFetches each fetch may be larger (three times
// on a one-broker cluster with the default k). Run calls it before every
// poll; it changes the sizes only when the number of brokers changed. A
// broker that joins can take one fetch sized for the brokers before it,
// before the next poll sees it: the bound is exceeded by that fetch until
// then.
func (s *Source) fitBrokers() {
	if s.limits.Load() == nil {
		return // no LimitFetch: the client's own sizes
	}
	n := len(s.cl.DiscoveredBrokers())
	if n == 0 || n == s.brokers {
		return
	}
	s.brokers = n
	s.limMu.Lock()
	defer s.limMu.Unlock()
	l := s.limits.Load()
	if k := min(max(s.fetches, 1), n); k != l.fetches {
		s.resizeLocked(k, l.expansion)
	}
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
	h.s.limMu.Lock()
	if cur := h.s.limits.Load(); e > cur.expansion {
		l = h.s.resizeLocked(cur.fetches, e)
	} else {
		l = nil // another batch raised it meanwhile
	}
	h.s.limMu.Unlock()
	if l != nil && h.s.lowered.CompareAndSwap(false, true) {
		h.s.log.Warn("fetched records are smaller, or compressed more, than runner.RecordShape states; fetch sizes lowered to keep the memory bound (logged once)",
			"partition", topic+"/"+strconv.Itoa(int(partition)), "records", m.NumRecords, "bytes", m.CompressedBytes,
			"uncompressed_bytes", m.UncompressedBytes, "expansion", math.Round(e*10)/10, "fetch_max_bytes", l.maxBytes)
	}
}
