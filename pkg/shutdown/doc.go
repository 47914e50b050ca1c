// Package shutdown coordinates a graceful stop under Kubernetes: on a
// signal it turns readiness off, shuts the runner down within a budget and
// closes the rest in order, and it serves liveness and readiness probes.
//
// Not built yet: see the project's issue on pkg/shutdown.
package shutdown
