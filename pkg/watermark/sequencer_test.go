package watermark_test

import (
	"testing"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// seqStep is one call on a Sequencer in a table test.
type seqStep struct {
	call string // "next", "acked", "failed", "reset"
	safe int64  // next: the safe offset; reset: the acked offset
	req  int    // acked, failed: index of the request (in order of issue)
	// next: whether a request is sent and for which offset
	sent     bool
	wantOff  int64
	wantAckd int64 // Acknowledged() after the step
}

func TestSequencer(t *testing.T) {
	U := watermark.Unknown
	tests := []struct {
		name  string
		steps []seqStep
	}{
		{"zero value sends the first safe offset", []seqStep{
			{call: "next", safe: 100, sent: true, wantOff: 100, wantAckd: U},
			{call: "acked", req: 0, wantAckd: 100},
			{call: "next", safe: 100, sent: false, wantAckd: 100},
		}},
		{"nothing at or below the acknowledged boundary", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 100, sent: false, wantAckd: 100},
			{call: "next", safe: 99, sent: false, wantAckd: 100},
			{call: "next", safe: -1, sent: false, wantAckd: 100},
		}},
		{"same offset in flight is not sent twice", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "next", safe: 103, sent: false, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
		}},
		{"late answer to an older request never lowers the boundary", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "acked", req: 1, wantAckd: 110},
			{call: "acked", req: 0, wantAckd: 110},
			{call: "next", safe: 110, sent: false, wantAckd: 110},
		}},
		{"older answer first raises it, newer still in flight", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "acked", req: 0, wantAckd: 103},
			{call: "next", safe: 110, sent: false, wantAckd: 103},
			{call: "acked", req: 1, wantAckd: 110},
		}},
		{"103 fails after 110 succeeded: 103 is never resent", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "acked", req: 1, wantAckd: 110},
			{call: "failed", req: 0, wantAckd: 110},
			{call: "next", safe: 110, sent: false, wantAckd: 110},
			{call: "next", safe: 112, sent: true, wantOff: 112, wantAckd: 110},
		}},
		{"newest fails: resend the newest safe offset, not the failed one", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "failed", req: 0, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
		}},
		{"unknown outcome: same safe offset resent under a new seq", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "failed", req: 0, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "acked", req: 1, wantAckd: 103},
		}},
		{"older failure while newer in flight changes nothing", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 103, sent: true, wantOff: 103, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "failed", req: 0, wantAckd: 100},
			{call: "next", safe: 110, sent: false, wantAckd: 100},
		}},
		{"a safe offset below one already sent is refused", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "failed", req: 0, wantAckd: 100},
			{call: "next", safe: 105, sent: false, wantAckd: 100},
		}},
		{"reset: answers from before it are ignored", []seqStep{
			{call: "reset", safe: 100, wantAckd: 100},
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: 100},
			{call: "reset", safe: 101, wantAckd: 101},
			{call: "acked", req: 0, wantAckd: 101},
			{call: "next", safe: 105, sent: true, wantOff: 105, wantAckd: 101},
		}},
		{"reset: the broker's lower start is authoritative", []seqStep{
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: U},
			{call: "acked", req: 0, wantAckd: 110},
			{call: "reset", safe: 90, wantAckd: 90},
			{call: "next", safe: 95, sent: true, wantOff: 95, wantAckd: 90},
		}},
		{"reset to unknown", []seqStep{
			{call: "next", safe: 110, sent: true, wantOff: 110, wantAckd: U},
			{call: "acked", req: 0, wantAckd: 110},
			{call: "reset", safe: U, wantAckd: U},
			{call: "next", safe: 3, sent: true, wantOff: 3, wantAckd: U},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s watermark.Sequencer
			var reqs []watermark.Request
			for i, st := range tt.steps {
				switch st.call {
				case "next":
					r, ok := s.Next(st.safe)
					if ok != st.sent || (ok && r.Offset != st.wantOff) {
						t.Fatalf("step %d: Next(%d) = %+v, %v; want offset %d, %v", i, st.safe, r, ok, st.wantOff, st.sent)
					}
					if ok {
						if n := len(reqs); n > 0 && r.Seq <= reqs[n-1].Seq {
							t.Fatalf("step %d: Seq %d not above %d", i, r.Seq, reqs[n-1].Seq)
						}
						if f, inFlight := s.InFlight(); !inFlight || f != r {
							t.Fatalf("step %d: InFlight() = %+v, %v; want %+v", i, f, inFlight, r)
						}
						reqs = append(reqs, r)
					}
				case "acked":
					s.Acked(reqs[st.req])
				case "failed":
					s.Failed(reqs[st.req])
				case "reset":
					s.Reset(st.safe)
					if _, inFlight := s.InFlight(); inFlight {
						t.Fatalf("step %d: request in flight after Reset", i)
					}
				}
				if got := s.Acknowledged(); got != st.wantAckd {
					t.Fatalf("step %d (%s): Acknowledged() = %d, want %d", i, st.call, got, st.wantAckd)
				}
			}
		})
	}
}

func TestSequencerIgnoresForeignAnswers(t *testing.T) {
	var s watermark.Sequencer
	s.Reset(100)
	s.Acked(watermark.Request{Seq: 7, Offset: 500}) // never handed out
	s.Acked(watermark.Request{Seq: 0, Offset: 500})
	if got := s.Acknowledged(); got != 100 {
		t.Fatalf("Acknowledged() = %d after foreign answers, want 100", got)
	}
}
