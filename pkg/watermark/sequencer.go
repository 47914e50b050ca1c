package watermark

// Request is one commit request for a partition: the offset to commit and
// the sequence number that identifies the request's answer.
type Request struct {
	// Seq increases with every request of a Sequencer, across Resets.
	Seq uint64
	// Offset is the offset to commit (the next offset to consume).
	Offset int64
}

// Sequencer keeps the two commit boundaries of one partition apart
// (invariant 2): the safe boundary, which the caller passes to Next and which
// comes from a [Tracker], and the acknowledged boundary, the highest offset
// the broker has confirmed. It hands out commit requests that never go
// backwards and takes their answers in any order:
//
//   - Next never returns an offset at or below the acknowledged one, nor
//     below one already sent since the last Reset, and sends nothing while a
//     request for the same offset is in flight.
//   - Acked raises the acknowledged boundary; a late answer to an older
//     request never lowers it.
//   - Failed (an error, a timeout or an unknown outcome; the broker may have
//     stored the offset) changes neither boundary; the next call to Next sends
//     the newest safe offset again, never an older one, as commitAsync
//     retries must (resending 103 after 110 succeeded would move the
//     committed offset back).
//
// The zero Sequencer is ready to use: its acknowledged boundary is Unknown,
// so the first safe offset offered is sent. Not safe for concurrent use.
type Sequencer struct {
	acked    int64 // the acknowledged boundary, if hasAcked
	hasAcked bool
	sent     int64 // the highest offset sent since the last Reset, if hasSent
	hasSent  bool
	flight   uint64 // Seq of the request carrying sent while it is in flight, else 0
	seq      uint64 // the last Seq handed out
	floor    uint64 // answers to requests with Seq <= floor predate the last Reset
}

// Reset starts a new assignment whose committed offset the broker reported
// as acked (Unknown, or any negative value, if not known). The broker's word
// is authoritative, so the acknowledged boundary becomes acked even if it is
// lower than before (an administrator may have reset the group's offsets).
// Requests sent before Reset are forgotten: their answers, if any still
// arrive, are ignored, since a commit from the previous group generation is
// rejected by the broker, and one it accepted is already in acked.
func (s *Sequencer) Reset(acked int64) {
	s.acked, s.hasAcked = acked, acked >= 0
	if !s.hasAcked {
		s.acked = Unknown
	}
	s.sent, s.hasSent, s.flight = 0, false, 0
	s.floor = s.seq
}

// Next returns the commit request to send for the safe offset safe, or false
// if there is nothing to send: safe is not above the acknowledged boundary,
// it is below an offset already sent, or a request for it is in flight. A
// returned request is in flight until Acked or Failed is called with it.
func (s *Sequencer) Next(safe int64) (Request, bool) {
	if safe < 0 || (s.hasAcked && safe <= s.acked) {
		return Request{}, false
	}
	if s.hasSent && (safe < s.sent || (safe == s.sent && s.flight != 0)) {
		return Request{}, false
	}
	s.seq++
	s.sent, s.hasSent, s.flight = safe, true, s.seq
	return Request{Seq: s.seq, Offset: safe}, true
}

// Acked records that the broker confirmed r. The acknowledged boundary
// becomes r.Offset if that is higher; an answer to an older request than one
// already confirmed never lowers it. Answers to requests from before the last
// Reset, or never handed out, are ignored.
func (s *Sequencer) Acked(r Request) {
	if !s.current(r) {
		return
	}
	if !s.hasAcked || r.Offset > s.acked {
		s.acked, s.hasAcked = r.Offset, true
	}
	if r.Seq == s.flight {
		s.flight = 0
	}
}

// Failed records that r failed or that its outcome is unknown. Neither
// boundary changes. If r is the newest request, nothing is in flight any
// more and the next call to Next sends the newest safe offset; an older
// request's failure changes nothing, since a newer one carries a higher
// offset.
func (s *Sequencer) Failed(r Request) {
	if s.current(r) && r.Seq == s.flight {
		s.flight = 0
	}
}

// current reports whether r was handed out since the last Reset.
func (s *Sequencer) current(r Request) bool { return r.Seq > s.floor && r.Seq <= s.seq }

// Acknowledged returns the acknowledged boundary: the highest offset the
// broker confirmed since the last Reset, or the offset passed to Reset;
// Unknown if neither.
func (s *Sequencer) Acknowledged() int64 {
	if !s.hasAcked {
		return Unknown
	}
	return s.acked
}

// InFlight returns the newest request still awaiting an answer, if any.
func (s *Sequencer) InFlight() (Request, bool) {
	if s.flight == 0 {
		return Request{}, false
	}
	return Request{Seq: s.flight, Offset: s.sent}, true
}
