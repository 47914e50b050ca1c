package runner

import (
	"context"
	"testing"
	"time"
)

// TestSinkAnswerWinsOverStop: a Sink call the loop answered just before it
// stopped returns the answer, not ErrStopped. Both channels are ready when
// the caller looks; select alone picks either, so about half of these calls
// returned ErrStopped for a hand-over the runner had taken.
func TestSinkAnswerWinsOverStop(t *testing.T) {
	for i := range 200 {
		r := &Runner{sinkCh: make(chan *sinkReq), loopDone: make(chan struct{})}
		go func() {
			req := <-r.sinkCh
			switch {
			case req.replyErr != nil:
				req.replyErr <- nil
			default:
				req.reply <- sinkReply{budget: 7}
			}
			close(r.loopDone) // the loop returns right after its last answer
		}()
		s := sinkOf{r}
		if i%2 == 0 {
			n, err := s.Fetched(context.Background(), nil)
			if err != nil || n != 7 {
				t.Fatalf("call %d: Fetched answered before the stop returned %d, %v; want 7, nil", i, n, err)
			}
			continue
		}
		if err := s.Revoked(context.Background(), nil, time.Time{}); err != nil {
			t.Fatalf("call %d: Revoked answered before the stop returned %v; want nil", i, err)
		}
	}
}
