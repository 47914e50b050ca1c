package runner

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The status page's per-partition figures (PartitionStats' additions),
// computed where the poll goroutine already touches the partition: the
// counts when a record comes back, the rest in the snapshot, once a
// commit interval.

// PauseCause says why a partition is paused; several may hold at once.
type PauseCause uint8

const (
	// PausedFlow: its records or bytes reached the high water marks.
	PausedFlow PauseCause = 1 << iota
	// PausedWindow: its uncommitted window is full behind its oldest
	// unfinished record.
	PausedWindow
	// PausedMemory: the runner's charge reached its global limit
	// (MaxBufferedBytes): every partition is paused.
	PausedMemory
	// PausedOperator: an operator paused it (PausePartitions,
	// PauseTopics).
	PausedOperator
	// PausedStopping: the runner is shutting down.
	PausedStopping
)

var pauseCauseNames = [...]string{"flow", "window", "memory", "operator", "stopping"}

// String returns the causes' names joined by commas ("flow", "window",
// "memory", "operator", "stopping"), or "" for none.
func (c PauseCause) String() string {
	var b strings.Builder
	for i, n := range pauseCauseNames {
		if c&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n)
		}
	}
	if rest := c &^ (1<<len(pauseCauseNames) - 1); rest != 0 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString("PauseCause(" + strconv.Itoa(int(rest)) + ")")
	}
	return b.String()
}

// pauseCause returns why ps is paused at the source (none when it is not).
func (s *pollState) pauseCause(ps *partState, windowFull bool) PauseCause {
	if !ps.srcPaused {
		return 0
	}
	var c PauseCause
	switch {
	case windowFull:
		c |= PausedWindow
	case ps.paused:
		c |= PausedFlow
	}
	if s.globalPaused {
		c |= PausedMemory
	}
	if ps.opPaused {
		c |= PausedOperator
	}
	if s.stopping {
		c |= PausedStopping
	}
	return c
}

// countResult counts t's record, which did not succeed, in its partition's
// dead-letter and fenced counts.
func (ps *partState) countResult(t *task) {
	switch t.res {
	case resDeadLettered:
		ps.deadLettered++
	case resFenced:
		ps.fencedN++
	}
}

// lanesInUse is how many of ps's lanes hold a record queued or running:
// KeyOrder's busy key lanes (the map also caches idle ones), PartitionOrder's
// one lane when busy, none in Unordered mode. It walks the key lanes: it is
// for the stats snapshot, once a commit interval.
func (ps *partState) lanesInUse() int {
	if ps.lane != nil {
		if ps.lane.busy {
			return 1
		}
		return 0
	}
	n := 0
	for _, l := range ps.lanes {
		if l.busy {
			n++
		}
	}
	return n
}

// oldestKey returns the printable key of ps's oldest unfinished record o,
// formatting it once per record (keyOff).
func (s *pollState) oldestKey(ps *partState, o oldestRecord) string {
	switch {
	case o.offset < 0:
		return ""
	case o.state == Fenced:
		return ps.fencedKey
	case ps.oldest == nil || ps.oldest.rec.Offset != o.offset:
		return ""
	case ps.keyOff != o.offset:
		ps.keyOff, ps.keyText = o.offset, printableKey(ps.oldest.rec.Key)
	}
	return ps.keyText
}

// keyClip is how many bytes of a key printableKey shows.
const keyClip = 64

// printableKey returns a printable form of a record's key for Stats:
// "" for a nil key; the key itself when it is valid UTF-8 of printable
// characters; else Go's quoted form (non-UTF-8 bytes as \x escapes).
// A key longer than keyClip bytes is clipped there (at a character
// boundary) and followed by "…(N bytes)".
func printableKey(k []byte) string {
	if k == nil {
		return ""
	}
	clipped := k
	if len(k) > keyClip {
		n := keyClip
		for n > keyClip-utf8.UTFMax && n > 0 && !utf8.RuneStart(k[n]) {
			n--
		}
		clipped = k[:n]
	}
	s := string(clipped)
	plain := utf8.ValidString(s) && len(s) > 0
	for _, r := range s {
		if !plain || !unicode.IsPrint(r) {
			plain = false
			break
		}
	}
	if !plain {
		s = strconv.Quote(s)
	}
	if len(clipped) < len(k) {
		s += "…(" + strconv.Itoa(len(k)) + " bytes)"
	}
	return s
}
