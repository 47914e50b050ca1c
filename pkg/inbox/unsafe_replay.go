//go:build tidemark_unsafe

package inbox

// This file exists only in a build with the tidemark_unsafe tag: the chaos
// suite's proof that its duplicate check can fail (integration/chaos,
// TestStrictCheckBites) builds examples/orders with it. A build without the
// tag has no UnsafeNoReplayProtection to call, and unsafeBuild is the
// constant false there (replay_protected.go), so the branches that read
// noReplayProtection are compiled out.

// unsafeBuild is true in a tidemark_unsafe build.
const unsafeBuild = true

// UnsafeNoReplayProtection switches the Store's replay protection off, for
// tests that must see what a broken inbox would do: the assign hook
// returns no Applied filters (no record is skipped before its handler
// runs), and a record whose inbox row already exists — or whose offset is
// below its partition's applied mark — has its effect run and committed
// again instead of being counted as a replay. Fencing by the lease is
// left as it is. It exists only in a build with the tidemark_unsafe tag;
// never ship such a build.
func UnsafeNoReplayProtection() Option {
	return func(c *config) { c.noReplayProtection = true }
}
