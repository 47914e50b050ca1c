package kafkatest

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Sampler polls a group's committed offsets on one topic and keeps every
// change per partition, to catch a committed offset going backward
// (invariant 2). Its methods are safe for concurrent use.
type Sampler struct {
	mu      sync.Mutex
	history map[int32][]Commit
	polls   int     // polls answered
	errs    []error // polls that failed
	stop    chan struct{}
	done    chan struct{}
}

// Sample starts a Sampler that reads group's committed offsets on topic
// every interval until Close or the test's cleanup. A partition's history
// keeps a sample when its offset or metadata differs from the previous one;
// "no commit" (-1) is not kept.
func (c *Cluster) Sample(group, topic string, every time.Duration) *Sampler {
	s := &Sampler{history: map[int32][]Commit{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			got, err := c.commits(group, topic)
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, err)
			} else {
				s.polls++
			}
			for p, o := range got {
				h := s.history[p]
				if n := len(h); o.Offset >= 0 && (n == 0 || h[n-1].Offset != o.Offset || h[n-1].Metadata != o.Metadata) {
					s.history[p] = append(h, o)
				}
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	c.t.Cleanup(s.Close)
	return s
}

// Close stops the sampling and waits for its goroutine; later calls do
// nothing.
func (s *Sampler) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// Backward describes the first committed offset that went backward, or "".
func (s *Sampler) Backward() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range slices.Sorted(maps.Keys(s.history)) {
		h := s.history[p]
		for i := 1; i < len(h); i++ {
			if h[i].Offset < h[i-1].Offset {
				return fmt.Sprintf("partition %d: committed %d (member %q) after %d (member %q)", p, h[i].Offset, h[i].Metadata, h[i-1].Offset, h[i-1].Metadata)
			}
		}
	}
	return ""
}

// Changes is how many changes the partitions' histories hold in all.
func (s *Sampler) Changes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.history {
		n += len(h)
	}
	return n
}

// Polls is how many polls the broker answered.
func (s *Sampler) Polls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.polls
}

// Errs returns the errors of the polls that failed.
func (s *Sampler) Errs() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// History returns a copy of every partition's changes, oldest first.
func (s *Sampler) History() map[int32][]Commit {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int32][]Commit, len(s.history))
	for p, h := range s.history {
		out[p] = slices.Clone(h)
	}
	return out
}
