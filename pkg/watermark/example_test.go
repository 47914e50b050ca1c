package watermark_test

import (
	"fmt"

	"github.com/tidemark/tidemark/pkg/watermark"
)

// The sparse delivery trace of seed 003: start 100, delivered [100, 103,
// 108], completed 108, 100, 103.
func ExampleTracker() {
	t := watermark.New(100)
	for _, off := range []int64{100, 103, 108} {
		if err := t.Deliver(off); err != nil {
			panic(err)
		}
	}
	for _, off := range []int64{108, 100, 103, 108} {
		o := t.Complete(off)
		fmt.Printf("complete %d: %-9v safe %d\n", off, o, t.Safe())
	}
	// Output:
	// complete 108: recorded  safe 100
	// complete 100: advanced  safe 101
	// complete 103: advanced  safe 109
	// complete 108: duplicate safe 109
}

// On a transactional topic the last record is followed by a commit marker
// the application never sees; the fetcher's position lets the safe offset
// pass it once nothing is outstanding, so lag reaches zero.
func ExampleTracker_Position() {
	t := watermark.New(100)
	_ = t.Deliver(100)
	_ = t.Deliver(101)
	fmt.Println(t.Position(103)) // 100 and 101 are outstanding
	t.Complete(100)
	t.Complete(101)
	fmt.Println(t.Safe(), t.Position(103), t.Safe())
	// Output:
	// false
	// 102 true 103
}

// commitAsync without going backwards: 103 is sent, then 110; 110 succeeds
// and 103 fails afterwards. 103 is never resent.
func ExampleSequencer() {
	var s watermark.Sequencer
	s.Reset(100) // the committed offset of the assignment
	r103, _ := s.Next(103)
	r110, _ := s.Next(110)
	s.Acked(r110)
	s.Failed(r103)
	_, resend := s.Next(110)
	fmt.Println(s.Acknowledged(), resend)
	// Output:
	// 110 false
}
