package main

// The handler body every consumer runs per record, the plain ones and
// tidemark alike: nothing, a sleep, or CPU-bound hashing.

import (
	"context"
	"crypto/sha256"
	"sync/atomic"
	"time"
)

var hashSink atomic.Uint32

// hashWork is the CPU-bound handler's work: rounds chained SHA-256 sums.
func hashWork(rounds int) {
	var sum [32]byte
	for range rounds {
		sum = sha256.Sum256(sum[:])
	}
	hashSink.Add(uint32(sum[0])) // keeps the compiler from dropping the loop
}

// work returns the handler body of spec: what every consumer does per
// record, so that the plain ones and tidemark do the same.
func work(spec childSpec) func(ctx context.Context) {
	switch spec.Handler {
	case "sleep":
		return func(ctx context.Context) {
			t := time.NewTimer(spec.Sleep)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	case "cpu":
		return func(context.Context) { hashWork(spec.HashRounds) }
	default:
		return nil
	}
}
