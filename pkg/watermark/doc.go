// Package watermark decides, for one Kafka partition, which offset is safe
// to commit when records are processed in parallel.
//
// A consumer has three kinds of progress that must not be confused: what the
// fetcher has returned (its position), what the business logic has finished,
// and what is committed to Kafka (where a restart resumes). A [Tracker]
// follows the records actually delivered, in delivery order, and moves the
// safe offset only across the contiguous completed prefix of them: delivered
// [100, 103, 108] with 100 and 103 complete gives 104; 108 must complete
// before 109. Offsets are sparse (transaction markers, compaction), so the
// tracker never does offset+1 arithmetic over offsets it was not given.
//
// A [Sequencer] keeps a partition's safe boundary and its acknowledged
// boundary apart, so that asynchronous commits never move the committed
// offset backwards, even when an old request fails or is answered late.
//
// Both types are pure (no I/O, no goroutines, no clock) and not safe for
// concurrent use: the runner's poll goroutine owns them.
package watermark
