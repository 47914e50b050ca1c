package runner

import (
	"context"
)

// Flow control (invariant 6). A partition is paused when the next poll
// could push it past its high water mark or its uncommitted window (its
// room is below pollChunk), or its bytes reached the byte high water mark;
// it is resumed at the low marks. Every partition is paused while the
// runner's charge is at its global limit.

// bands is the number of budget bands (see budget).
const bands = 16

// pollChunk is the least room an unpaused partition keeps below its high
// water mark and its window: half the gap between the water marks.
func (s *pollState) pollChunk() int {
	return max((s.cfg.highRecords-s.cfg.lowRecords)/2, 1)
}

// room is how many records a poll may bring to ps without passing its high
// water mark or its uncommitted window.
func (s *pollState) room(ps *partState) int {
	return min(s.cfg.highRecords-ps.count, s.cfg.window-ps.p.Tracker().Outstanding())
}

// budget is how many records the next poll may take without pushing an
// unpaused partition past its high water mark or its window. It is O(1):
// unpaused partitions are kept in bands by room (setBand), and the budget is
// the least room of the lowest band that has one, rounded down to the
// band's lower edge (at most 1/32 of the gap between the water marks below
// the exact least room). A paused partition is fetched again only after it
// was resumed at the low water mark, and a poll issued now may return only
// after that: its room counts as high minus low, the most the budget is.
// The budget is never below pollChunk, because checkFlow pauses a partition
// once its room falls below that: one nearly full partition must not shrink
// every poll to a few records.
func (s *pollState) budget() int {
	pc, gap := s.pollChunk(), s.cfg.highRecords-s.cfg.lowRecords
	span := gap - pc
	for b, n := range s.bandCount {
		if n > 0 {
			return pc + (b*span+bands-1)/bands // the least room band b holds
		}
	}
	return max(gap, 1)
}

// bandOf returns the band of an unpaused partition with room rooms, or -1
// when its room is at least high minus low (it cannot lower the budget).
// Rooms in [pollChunk, high-low) map to bands 0..bands-1 in order.
func (s *pollState) bandOf(room int) int {
	pc, gap := s.pollChunk(), s.cfg.highRecords-s.cfg.lowRecords
	if room >= gap || gap <= pc {
		return -1
	}
	return max(room-pc, 0) * bands / (gap - pc)
}

// setBand moves ps to the budget band of its room; partitions paused,
// revoking or closed are in none.
func (s *pollState) setBand(ps *partState) {
	b := -1
	if !ps.paused && !ps.revoking && !ps.closed {
		b = s.bandOf(s.room(ps))
	}
	if b == ps.band {
		return
	}
	if ps.band >= 0 {
		s.bandCount[ps.band]--
	}
	if b >= 0 {
		s.bandCount[b]++
	}
	ps.band = b
}

// checkFlow pauses a partition when the next poll could push it past its
// high water mark or its window (its room is below pollChunk), or its bytes
// reached the byte high water mark; it resumes it at the low water marks
// (the window's low mark is the window less the gap between the water
// marks). It then applies the global limit.
func (s *pollState) checkFlow(ps *partState) {
	if !ps.revoking && !ps.closed {
		cfg := s.cfg
		outstanding := ps.p.Tracker().Outstanding()
		switch {
		case !ps.paused && (s.room(ps) < s.pollChunk() || ps.bytes >= cfg.highBytes):
			ps.paused = true
			s.flowDirty = append(s.flowDirty, ps)
		case ps.paused && ps.count <= cfg.lowRecords && ps.bytes <= cfg.lowBytes &&
			outstanding <= cfg.window-(cfg.highRecords-cfg.lowRecords):
			ps.paused = false
			ps.windowWarned = false
			s.flowDirty = append(s.flowDirty, ps)
		}
		if ps.paused && !ps.windowWarned && cfg.window-outstanding < s.pollChunk() {
			ps.windowWarned = true
			s.tel.windowFull.Add(context.Background(), 1, ps.tel.add...)
			o := s.oldest(ps)
			args := []any{"partition", ps.tp.String(), "window", cfg.window, "outstanding", outstanding,
				"oldest", o.record(ps.tp), "state", o.state.String(), "age", o.age}
			if o.attempts > 0 {
				// Only a record that failed has attempts and an error
				// to show; one still running or queued has neither.
				args = append(args, "attempts", o.attempts, "err", o.err)
			}
			s.log.Warn("partition paused: its uncommitted window is full behind its oldest unfinished record", args...)
		}
	}
	s.setBand(ps)
	s.checkGlobal()
}

// checkGlobal applies the global limit: every partition pauses while the
// runner's claim (its charge and what the next hand-over can grow the
// tracker rings by) is at pauseAt and resumes once it fell to half. It runs
// whenever the charge falls, including when a lost or revoked partition's
// records leave it.
func (s *pollState) checkGlobal() {
	switch c := s.claimed(); {
	case !s.globalPaused && c >= s.pauseAt:
		s.globalPaused = true
		for _, p := range s.parts {
			s.flowDirty = append(s.flowDirty, p)
		}
	case s.globalPaused && c <= s.pauseAt/2:
		s.globalPaused = false
		for _, p := range s.parts {
			s.flowDirty = append(s.flowDirty, p)
		}
	}
}

// flushFlow adds the partitions whose paused state changed to the actions'
// pause and resume lists, for the Runner to tell the source.
func (s *pollState) flushFlow() {
	if len(s.flowDirty) == 0 {
		return
	}
	for _, ps := range s.flowDirty {
		if ps.closed {
			continue
		}
		want := (ps.paused || ps.opPaused || s.globalPaused || s.stopping) && !ps.revoking
		if s.stopping {
			want = true
		}
		if want == ps.srcPaused {
			continue
		}
		ps.srcPaused = want
		if want {
			s.acts.pause = append(s.acts.pause, ps.tp)
			s.tel.pauses.Add(context.Background(), 1, ps.tel.add...)
		} else {
			s.acts.resume = append(s.acts.resume, ps.tp)
		}
	}
	clear(s.flowDirty)
	s.flowDirty = s.flowDirty[:0]
}
