package watermark

// RingLen returns the size of t's ring, for the memory bound's tests.
func RingLen(t *Tracker) int { return len(t.ring) }
