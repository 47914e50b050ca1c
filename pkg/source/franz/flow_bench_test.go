package franz_test

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

// benchSourceT is a Source whose client never connects (the test calls its
// methods directly).
func benchSourceT(tb testing.TB) *franz.Source {
	tb.Helper()
	src, err := franz.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, franz.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { src.Close() })
	return src
}

func benchSource(b *testing.B, parts int) (*franz.Source, []runner.TP) {
	b.Helper()
	src := benchSourceT(b)
	tps := make([]runner.TP, parts)
	for i := range tps {
		tps[i] = runner.TP{Topic: "t", Partition: int32(i)}
		src.Own(tps[i], "m")
	}
	return src, tps
}

// BenchmarkFlowFlapping is one poll's flow control while water marks flap:
// half the partitions are paused, and between two polls a tenth of them are
// resumed and another tenth paused, each in its own call (the runner tells
// the source once per loop iteration, and each partition crosses its mark
// in an iteration of its own). The cost per poll is what the client's
// calls cost: franz-go copies its paused set on each.
func BenchmarkFlowFlapping(b *testing.B) {
	for _, parts := range []int{12, 120, 1200} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			src, tps := benchSource(b, parts)
			for _, tp := range tps[:parts/2] {
				src.Pause([]runner.TP{tp})
			}
			src.ApplyFlow()
			k := max(parts/10, 1)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// Resume the k paused longest, pause the next k.
				for j := range k {
					src.Resume([]runner.TP{tps[(i+j)%parts]})
					src.Pause([]runner.TP{tps[(i+parts/2+j)%parts]})
				}
				src.ApplyFlow()
				i = (i + k) % parts
			}
		})
	}
}

// BenchmarkDropHeld is a revoke of half the partitions while every one of
// them has records held.
func BenchmarkDropHeld(b *testing.B) {
	for _, parts := range []int{12, 120, 1200} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			src, tps := benchSource(b, parts)
			held := make([]runner.Batch, parts)
			for i, tp := range tps {
				held[i] = runner.Batch{TP: tp, Records: []runner.Record{{Topic: tp.Topic, Partition: tp.Partition}}, Position: 1}
			}
			b.ReportAllocs()
			for b.Loop() {
				src.Hold(held)
				src.DropHeld(tps[:parts/2])
			}
		})
	}
}
