// Package shutdown stops a tidemark service gracefully under Kubernetes and
// serves probes that mean something.
//
// A Coordinator waits for SIGTERM or SIGINT (the program installs the signal
// channel; the library never does), turns readiness off, shuts the runner
// down within a budget (drain, final commit, leave the group), then runs the
// program's closers in order (HTTP servers, database pool, telemetry flush)
// with what is left, and returns an error whose ExitCode says whether the
// drain finished in time. A second signal stops at once. Closing the
// signal channel asks for the stop as a signal does, and is never a second
// signal.
//
// Probes serves /livez, /readyz and /statusz:
//
//   - liveness fails only when the runner's poll loop itself stops making
//     progress (its tick is stale, or Run returned outside a shutdown) —
//     never because a handler, a downstream or Kafka is slow, which would
//     turn an overload into a restart storm;
//   - readiness is true while the runner runs, is not draining, has joined
//     its group (an empty assignment counts) and its group's coordinator
//     answered within ContactLimit (DefaultContactLimit, 90s). It is false
//     before the first answer, so a wrong broker address keeps a pod
//     unready; a Kafka outage makes every pod unready, which a
//     PodDisruptionBudget turns into blocked node drains (docs/operations.md,
//     "Readiness");
//   - /statusz is a part of the runner's Stats as JSON (pkg/status's page
//     has all of it), including the age of the
//     oldest unfinished record per partition (alert on it for a stuck
//     handler; the same value is the tidemark.record.oldest_age gauge).
//
// The budget is the whole stop, from the signal to the process's exit.
// NewCoordinator reads it from TIDEMARK_SHUTDOWN_BUDGET (a Go duration)
// unless a Budget option is given, which wins; a bad value is
// NewCoordinator's error. Without either it is 20s, comfortably under
// Kubernetes' default 30s grace period, which must also cover a preStop
// delay: terminationGracePeriodSeconds ≥ preStop + budget. Reserve splits
// it: the runner's drain gets the budget less what is reserved for the
// final commit (and leaving the group) and for the closers — by default
// 13s, 5s and 2s of 20s.
//
// Run the runner under a ctx the signal does not end (the orders example
// uses context.Background()): the coordinator stops it. A program that
// also ends Run's ctx on the signal (signal.NotifyContext) gets one stop
// from both, in either order: the drain ends at the earlier of Reserve's
// drain end and the runner's DrainBudget after the signal, and the final
// commit keeps its reserve. Give the runner a DrainBudget at least the
// coordinator's drain, or the DrainBudget is what ends the drain.
package shutdown
