package runner

import "sync"

// worker runs tasks until the work queue is closed.
func (r *Runner) worker() {
	for t := r.workq.pop(); t != nil; t = r.workq.pop() {
		switch {
		case t.ps.draining.Load() || t.ps.ctx.Err() != nil:
			// Its partition started draining, was lost or is closing
			// since the task was queued: leave the record to the next
			// owner rather than lengthen the drain.
			t.res = resCancelled
			if b := t.batch; b != nil {
				b.finish(resCancelled)
			}
		case t.batch != nil:
			r.executeBatch(t.batch)
		default:
			r.execute(t)
		}
		r.doneq.push(t)
	}
}

// workQueue hands tasks from the poll goroutine to the workers. It is a
// mutex-guarded list rather than a channel so the poll goroutine can hand
// over a whole batch with one lock, and each worker takes one task at a
// time: a slow handler holds only its own record, never a batch behind it.
// Its cond must be tied to mu before use (New does).
type workQueue struct {
	mu      sync.Mutex
	cond    sync.Cond
	q       queue
	waiting int
	closed  bool
}

// push appends the n tasks linked head..tail (through nextQ) and wakes up
// to n waiting workers.
func (w *workQueue) push(head, tail *task, n int) {
	w.mu.Lock()
	if w.q.tail == nil {
		w.q.head = head
	} else {
		w.q.tail.nextQ = head
	}
	w.q.tail = tail
	w.q.n += n
	wake := min(n, w.waiting)
	w.mu.Unlock()
	for range wake {
		w.cond.Signal()
	}
}

// pop returns the next task, waiting for one; nil once closed and empty.
func (w *workQueue) pop() *task {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.q.n == 0 {
		if w.closed {
			return nil
		}
		w.waiting++
		w.cond.Wait()
		w.waiting--
	}
	return w.q.pop()
}

func (w *workQueue) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cond.Broadcast()
}

// doneList carries finished tasks back to the poll goroutine: workers append
// under a mutex and signal only when the list was empty, and the poll
// goroutine takes the whole list at once.
type doneList struct {
	mu     sync.Mutex
	q      queue
	signal chan struct{} // capacity 1
}

func (d *doneList) push(t *task) {
	d.mu.Lock()
	wasEmpty := d.q.n == 0
	d.q.push(t)
	d.mu.Unlock()
	if wasEmpty {
		select {
		case d.signal <- struct{}{}:
		default:
		}
	}
}

// take returns the finished tasks linked through nextQ.
func (d *doneList) take() *task {
	d.mu.Lock()
	h := d.q.head
	d.q = queue{}
	d.mu.Unlock()
	return h
}
