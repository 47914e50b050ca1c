package rebalance_test

import (
	"fmt"

	"github.com/tidemark/tidemark/pkg/rebalance"
)

// The normal trace of seed 003: delivered [100, 103, 108], completed in the
// order 108, 100, 103. The safe offset waits for 100, then for 103, and
// never counts the undelivered 101, 102 or 104-107.
func Example_normal() {
	tb := rebalance.NewTable()
	tp := rebalance.TP{Topic: "orders", Partition: 0}
	p := tb.Assign(tp, 100)
	for _, off := range []int64{100, 103, 108} {
		if err := p.Deliver(off); err != nil {
			panic(err)
		}
	}
	for _, off := range []int64{108, 100, 103} {
		o := tb.Complete(tp, p.Epoch(), off)
		fmt.Printf("complete %d: %-8v safe %d\n", off, o, p.Safe())
	}
	// Output:
	// complete 108: recorded safe 100
	// complete 100: advanced safe 101
	// complete 103: advanced safe 109
}

// The stale trace: the member rejoins with the same partition, which gets a
// new local epoch; the completions of the first epoch's workers arrive
// afterwards and move nothing.
func Example_stale() {
	tb := rebalance.NewTable()
	tp := rebalance.TP{Topic: "orders", Partition: 0}
	old := tb.Assign(tp, 100).Epoch()
	p := tb.Assign(tp, 100) // same partition, new epoch
	for _, off := range []int64{100, 103, 108} {
		if err := p.Deliver(off); err != nil {
			panic(err)
		}
	}
	for _, off := range []int64{108, 100, 103} {
		o := tb.Complete(tp, old, off)
		fmt.Printf("complete %d (epoch %d): %v, safe %d\n", off, old, o, p.Safe())
	}
	oldAssignment, _ := tb.Stale()
	fmt.Println("dropped as old-assignment:", oldAssignment)
	// Output:
	// complete 108 (epoch 1): old-assignment, safe 100
	// complete 100 (epoch 1): old-assignment, safe 100
	// complete 103 (epoch 1): old-assignment, safe 100
	// dropped as old-assignment: 3
}

// The handoff trace: revoke after 100 completes (commit 101), a late
// completion from the revoked epoch, then the partition comes back under a
// new epoch and replays 103 and 108.
func Example_handoff() {
	tb := rebalance.NewTable()
	tp := rebalance.TP{Topic: "orders", Partition: 0}
	show := func(what string, o rebalance.Outcome) {
		fmt.Printf("%-22s %-14v safe %d\n", what, o, tb.Lookup(tp).Safe())
	}

	p := tb.Assign(tp, 100)
	e1 := p.Epoch()
	for _, off := range []int64{100, 103, 108} {
		_ = p.Deliver(off)
	}
	show("complete 100 (epoch 1)", tb.Complete(tp, e1, 100))
	final, _ := tb.Revoke(tp)
	fmt.Println("revoke: commit", final)
	show("complete 103 (epoch 1)", tb.Complete(tp, e1, 103))

	p = tb.Assign(tp, final)
	e2 := p.Epoch()
	for _, off := range []int64{103, 108} {
		_ = p.Deliver(off)
	}
	show("complete 108 (epoch 1)", tb.Complete(tp, e1, 108))
	show("complete 108 (epoch 2)", tb.Complete(tp, e2, 108))
	show("complete 103 (epoch 2)", tb.Complete(tp, e2, 103))
	show("complete 108 (epoch 2)", tb.Complete(tp, e2, 108))
	// Output:
	// complete 100 (epoch 1) advanced       safe 101
	// revoke: commit 101
	// complete 103 (epoch 1) not-owner      safe 101
	// complete 108 (epoch 1) old-assignment safe 101
	// complete 108 (epoch 2) recorded       safe 101
	// complete 103 (epoch 2) advanced       safe 109
	// complete 108 (epoch 2) duplicate      safe 109
}

// A commit loop on the poll goroutine: Pending offers each owned partition's
// newest safe offset once; answers may arrive late and out of order.
func ExampleTable_Pending() {
	tb := rebalance.NewTable()
	tp := rebalance.TP{Topic: "orders", Partition: 0}
	p := tb.Assign(tp, 100)
	for off := int64(100); off < 110; off++ {
		_ = p.Deliver(off)
	}
	tb.Complete(tp, p.Epoch(), 100)
	tb.Complete(tp, p.Epoch(), 101)
	tb.Complete(tp, p.Epoch(), 102)
	first := tb.Pending(nil) // 103, sent asynchronously
	for off := int64(103); off < 110; off++ {
		tb.Complete(tp, p.Epoch(), off)
	}
	second := tb.Pending(nil) // 110, while 103 is still in flight
	fmt.Println("sent", first[0].Offset, "then", second[0].Offset)

	tb.Committed(second[0])
	tb.CommitFailed(first[0]) // the older request fails afterwards
	fmt.Println("acknowledged", p.Acknowledged(), "pending", len(tb.Pending(nil)))
	// Output:
	// sent 103 then 110
	// acknowledged 110 pending 0
}
