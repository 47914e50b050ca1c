package kafkago

import (
	"context"
	"errors"
	"sync"

	"github.com/tidemark/tidemark/pkg/runner"
)

// handover gives the runner what the fetchers of one generation fetched.
// Fetchers queue what they fetched; one goroutine (run) takes from the
// front of the queue as many records as the runner's last budget allows,
// from as many partitions as that covers, and hands them over in one
// Sink.Fetched call. A hand-over thus costs the same whether the records
// come from one partition or from a thousand, and a fetcher never waits
// for the others: it waits only for its own records to be taken.
//
// A paused partition's fetcher leaves the queue and keeps what it fetched
// (parked); Resume queues it again. So a pause costs no fetch, and what the
// adapter holds stays at most one fetch per partition (see LimitFetch).
//
// Every field of a fetcher marked "guarded by handover.mu" is; so are the
// queue's links. The fetcher's next and held belong to its goroutine while
// it fetches (state fetching) and to the hand-over otherwise; the channel
// taken passes them back.
type handover struct {
	s    *Source
	sink runner.Sink

	mu    sync.Mutex
	queue fetcherList // fetchers whose records wait, unpaused, oldest first

	kick chan struct{} // capacity 1: the queue got a fetcher
	done chan struct{} // closed when run returns
}

// The states of a fetcher, guarded by handover.mu.
const (
	fetching = iota // its goroutine owns next and held (held is nil)
	queued          // held waits in the queue
	parked          // held waits for a Resume (the partition is paused)
	handing         // held is in a hand-over to the runner
)

func newHandover(s *Source, sink runner.Sink) *handover {
	return &handover{s: s, sink: sink, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// offer gives h the records a fetch brought and waits until all of them
// were handed over. It returns false, with the records dropped, when ctx
// ended or the hand-over stopped first.
func (h *handover) offer(ctx context.Context, f *fetcher, hd *held) bool {
	h.mu.Lock()
	f.held = hd
	if f.paused {
		f.state = parked
	} else {
		f.state = queued
		h.queue.pushBack(f)
	}
	h.mu.Unlock()
	h.wakeUp()
	select {
	case <-f.taken:
		return true
	case <-ctx.Done():
	case <-h.done:
	}
	return false
}

// waitUnpaused returns once f's partition is not paused (true), or when ctx
// ends or the hand-over stopped (false).
func (h *handover) waitUnpaused(ctx context.Context, f *fetcher) bool {
	for {
		h.mu.Lock()
		p := f.paused
		h.mu.Unlock()
		if !p {
			return true
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
			return false
		case <-h.done:
			return false
		}
	}
}

// setPaused pauses or resumes fs. A paused fetcher's records leave the
// queue; a resumed one's join its end. It does not block.
func (h *handover) setPaused(fs []*fetcher, paused bool) {
	h.mu.Lock()
	kick := false
	for _, f := range fs {
		if f.paused == paused {
			continue
		}
		f.paused = paused
		switch {
		case paused && f.state == queued:
			h.queue.remove(f)
			f.state = parked
		case !paused && f.state == parked:
			h.queue.pushBack(f)
			f.state = queued
			kick = true
		}
	}
	h.mu.Unlock()
	if kick {
		h.wakeUp()
	}
	if !paused {
		for _, f := range fs {
			select {
			case f.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (h *handover) wakeUp() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run hands queued records to the runner until ctx ends or the runner
// stops. Its error is never fatal to Run: a runner that refuses records
// for another reason than stopping is logged.
func (h *handover) run(ctx context.Context) {
	defer close(h.done)
	var batches []runner.Batch
	var taking []*fetcher
	for {
		batches, taking = h.take(batches[:0], taking[:0])
		if len(batches) == 0 {
			select {
			case <-h.kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		budget, err := h.sink.Fetched(ctx, batches)
		if err != nil {
			// ErrStopped: fetching ends. Otherwise ctx ended before the
			// runner took the records: nothing was delivered, and the
			// generation is ending.
			if !errors.Is(err, runner.ErrStopped) && ctx.Err() == nil {
				h.s.log.Error("runner refused records; fetching stops for this generation", "err", err)
			}
			return
		}
		h.s.budget = max(budget, 1)
		h.settle(taking, batches)
		clear(batches) // the runner copied what it keeps
		clear(taking)
	}
}

// take moves fetchers from the front of the queue into a hand-over, with
// at most the runner's budget of records in all, and returns their
// batches. A fetcher whose records do not all fit gives the first ones.
func (h *handover) take(batches []runner.Batch, taking []*fetcher) ([]runner.Batch, []*fetcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	left := h.s.budget
	for left > 0 {
		f := h.queue.popFront()
		if f == nil {
			break
		}
		f.state = handing
		hd := f.held
		b := runner.Batch{TP: f.tp, Records: hd.recs, Position: hd.end, HighWatermark: hd.hwm}
		if len(hd.recs) > left {
			b.Records = hd.recs[:left]
			b.Position = hd.recs[left-1].Offset + 1
		}
		left -= len(b.Records)
		batches = append(batches, b)
		taking = append(taking, f)
	}
	return batches, taking
}

// settle records what the runner took: a fetcher whose records were all
// taken fetches again; one with records left goes back to the end of the
// queue, or is parked if the runner paused its partition meanwhile.
func (h *handover) settle(taking []*fetcher, batches []runner.Batch) {
	h.mu.Lock()
	var done []*fetcher
	for i, f := range taking {
		b := &batches[i]
		f.next = b.Position
		hd := f.held
		if rest := hd.recs[len(b.Records):]; len(rest) > 0 {
			hd.recs = rest
			if f.paused {
				f.state = parked
			} else {
				f.state = queued
				h.queue.pushBack(f) // run takes from the queue again at once
			}
			continue
		}
		f.held = nil
		f.state = fetching
		done = append(done, f)
	}
	h.mu.Unlock()
	for _, f := range done {
		f.taken <- struct{}{} // capacity 1, and f waits for nothing else
	}
}

// fetcherList is a doubly linked list of fetchers through their qprev and
// qnext links; the zero value is empty.
type fetcherList struct{ head, tail *fetcher }

func (l *fetcherList) pushBack(f *fetcher) {
	f.qprev, f.qnext = l.tail, nil
	if l.tail != nil {
		l.tail.qnext = f
	} else {
		l.head = f
	}
	l.tail = f
}

func (l *fetcherList) remove(f *fetcher) {
	if f.qprev != nil {
		f.qprev.qnext = f.qnext
	} else {
		l.head = f.qnext
	}
	if f.qnext != nil {
		f.qnext.qprev = f.qprev
	} else {
		l.tail = f.qprev
	}
	f.qprev, f.qnext = nil, nil
}

func (l *fetcherList) popFront() *fetcher {
	f := l.head
	if f != nil {
		l.remove(f)
	}
	return f
}
