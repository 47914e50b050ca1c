package main

// A franz-go client's fetch settings: read back from a client, applied
// to one, and compared, so a plain loop can fetch as tidemark's franz
// adapter does.

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchSettings are a franz-go client's fetch options, as OptValue reads
// them back.
type fetchSettings struct {
	MaxBytes          int32         `json:"fetch_max_bytes"`
	MaxPartitionBytes int32         `json:"fetch_max_partition_bytes"`
	ConcurrentFetches int           `json:"max_concurrent_fetches"`
	MaxWait           time.Duration `json:"fetch_max_wait"`
	MinBytes          int32         `json:"fetch_min_bytes"`
	ReadCommitted     bool          `json:"read_committed"`
}

// clientFetch reads cl's fetch settings. It must not run while cl fetches:
// franz-go stores the sizes atomically (UpdateFetchMaxBytes) but OptValue
// reads them plainly.
func clientFetch(cl *kgo.Client) fetchSettings {
	var f fetchSettings
	f.MaxBytes, _ = cl.OptValue(kgo.FetchMaxBytes).(int32)
	f.MaxPartitionBytes, _ = cl.OptValue(kgo.FetchMaxPartitionBytes).(int32)
	f.ConcurrentFetches, _ = cl.OptValue(kgo.MaxConcurrentFetches).(int)
	f.MaxWait, _ = cl.OptValue(kgo.FetchMaxWait).(time.Duration)
	f.MinBytes, _ = cl.OptValue(kgo.FetchMinBytes).(int32)
	level, _ := cl.OptValue(kgo.FetchIsolationLevel).(int8)
	f.ReadCommitted = level == 1 // kmsg: 0 read uncommitted, 1 read committed
	return f
}

// opts returns the client options that set f.
func (f fetchSettings) opts() []kgo.Opt {
	iso := kgo.ReadUncommitted()
	if f.ReadCommitted {
		iso = kgo.ReadCommitted()
	}
	return []kgo.Opt{kgo.FetchMaxBytes(f.MaxBytes), kgo.FetchMaxPartitionBytes(f.MaxPartitionBytes),
		kgo.MaxConcurrentFetches(f.ConcurrentFetches), kgo.FetchMaxWait(f.MaxWait), kgo.FetchMinBytes(f.MinBytes),
		kgo.FetchIsolationLevel(iso)}
}

func (f fetchSettings) String() string {
	return fmt.Sprintf("FetchMaxBytes %d, FetchMaxPartitionBytes %d, MaxConcurrentFetches %d, FetchMaxWait %v, FetchMinBytes %d, read committed %v",
		f.MaxBytes, f.MaxPartitionBytes, f.ConcurrentFetches, f.MaxWait, f.MinBytes, f.ReadCommitted)
}
