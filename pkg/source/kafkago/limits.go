package kafkago

import (
	"fmt"
	"math"

	"github.com/tidemark/tidemark/pkg/runner"
)

// What the adapter holds for records, and how LimitFetch bounds it.
//
// Each partition's fetcher has at most one fetch at a time: in flight, or
// held until the runner took all of it (a paused partition keeps its
// held fetch). A fetch of w bytes on the wire keeps, until it is handed
// over:
//
//	w                    the answer's frame (uncompressed batches' keys and
//	                     values point into it)
//	≤ 2·C·w              the decompressed batches (C = MaxCompression; a
//	                     decompressing buffer grows to at most twice what it
//	                     holds; snappy is decoded into an exact buffer, C·w)
//	≤ (C·w / S) · R      the runner.Records (S = MinRecordBytes, R = the size
//	                     of a runner.Record, 136 bytes on 64-bit; each header
//	                     adds the size of a runner.Header, 40, and its key)
//
// so at most E·w with E = 1 + 2·C + C·R/S (17.5 with the defaults 64 bytes
// and 4). With P partitions assigned and a fetch size F per partition, the
// adapter holds at most P·E·F, and LimitFetch makes that FetchLimits.Bytes:
//
//	F = min(MaxBytes, PartitionBytes / C, Bytes / (P·E))
//
// (12 partitions, the runner's defaults: F = 64 MiB / (12 · 17.5) ≈ 312 KiB).
// Not counted: kafka-go's codec state while a gzip, lz4 or zstd batch
// decompresses (pooled, one per decompression in progress; snappy has
// none) and a connection's 4 KiB read buffer.
//
// A broker answers a fetch with at least one whole batch even when it is
// larger than F (KIP-74), so the bound also needs F ≥ the largest batch
// (the topic's max.message.bytes bounds it); below that each partition can
// hold E times its largest batch. Records smaller than S, or compressed
// more than C, make a fetch keep more than E per wire byte: the fetcher
// measures what each fetch keeps and sizes its next fetch so that it
// would keep E·F at that rate (lowering at once, logged once; raising at
// most twofold per fetch, never above F).

// fetchSize is one partition's fetch size and the memory a fetch of it may
// take.
type fetchSize struct {
	bytes  int32
	memory int64
}

// LimitFetch implements runner.FetchLimiter: it bounds what the adapter
// holds for fetched records to l.Bytes, from the next generation on (the
// fetch size depends on the number of partitions assigned; see the comment
// above). runner.New calls it before Run. It returns an error naming the
// field when l cannot be met: Bytes, MinRecordBytes or MaxCompression
// below 1. It is safe to call concurrently with everything else.
func (s *Source) LimitFetch(l runner.FetchLimits) error {
	switch {
	case l.Bytes < 1:
		return fmt.Errorf("kafkago: FetchLimits.Bytes %d is not positive", l.Bytes)
	case l.MinRecordBytes < 1:
		return fmt.Errorf("kafkago: FetchLimits.MinRecordBytes %d is not positive", l.MinRecordBytes)
	case l.MaxCompression < 1 || math.IsInf(l.MaxCompression, 0) || math.IsNaN(l.MaxCompression):
		return fmt.Errorf("kafkago: FetchLimits.MaxCompression %g is not a ratio of at least 1", l.MaxCompression)
	}
	s.limits.Store(&l)
	return nil
}

// expansion is E: the most memory a fetch keeps per byte on the wire,
// under l's assumptions.
func expansion(l runner.FetchLimits) float64 {
	c := l.MaxCompression
	return 1 + 2*c + c*float64(recordOverhead)/float64(l.MinRecordBytes)
}

// fetchSizeFor returns the fetch size of each of p partitions: MaxBytes,
// or less under the limits LimitFetch set.
func (s *Source) fetchSizeFor(p int) fetchSize {
	f := float64(s.cfg.maxBytes)
	l := s.limits.Load()
	if l == nil {
		return fetchSize{bytes: int32(f), memory: math.MaxInt64}
	}
	e := expansion(*l)
	if l.PartitionBytes > 0 {
		f = min(f, float64(l.PartitionBytes)/l.MaxCompression)
	}
	f = max(math.Floor(min(f, float64(l.Bytes)/(float64(max(p, 1))*e))), 1)
	return fetchSize{bytes: int32(f), memory: int64(f * e)}
}

// resize sets the next fetch's size from what the last one keeps: kept
// bytes for wire bytes of answer. When records are smaller, or compress
// better, than FetchLimits assumes, a fetch keeps more per wire byte than
// E: the next one is made smaller in proportion at once (logged once per
// Source). When they are larger, it grows back, at most doubling per
// fetch and never above the size LimitFetch allows.
func (f *fetcher) resize(wire, kept int64) {
	if wire <= 0 || kept <= 0 || f.perFetch == math.MaxInt64 {
		return // no limits: every fetch is MaxBytes
	}
	// In float64 and clamped before the conversion: a float64 beyond the
	// int64 range does not convert to anything useful.
	target := int64(min(max(float64(f.perFetch)*float64(wire)/float64(kept), 1), float64(f.maxSize)))
	switch {
	case target < int64(f.size):
		if f.s.shrunk.CompareAndSwap(false, true) {
			f.s.log.Warn("a fetch kept more memory per byte than FetchLimits allows (records smaller or compressed better than runner.RecordShape states); lowering the fetch size",
				"partition", f.tp.String(), "wire_bytes", wire, "kept_bytes", kept, "fetch_bytes", f.size, "new_fetch_bytes", target)
		}
		f.size = int32(target)
	case target > int64(f.size):
		f.size = int32(min(target, 2*int64(f.size)))
	}
}
