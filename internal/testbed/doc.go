// Package testbed runs tidemark's test bed: a real Apache Kafka broker
// (KRaft, broker and controller in one JVM) and a real PostgreSQL server on
// 127.0.0.1, with their data and logs under one directory (.testbed in the
// checkout). It is the lifecycle behind scripts/testbed (which provisions
// packages and the broker's jars, then runs cmd/testbed) and what the chaos
// suite calls to restart a service under load. It is not part of tidemark's
// API; docs/testbed.md is its manual.
//
// A Bed acts on the processes its state file (state.json) records: Up
// starts what does not run and records each process as soon as it is
// started, Down stops exactly the recorded processes after checking that
// each still is ours (its command line names our server.properties or our
// data directory), and Stop, Start and Restart act on one service and keep
// its data. Every process is started in a process group of its own, so a
// signal to the terminal or to make's shell does not reach it.
//
// Two things a caller must know. A Bed is not safe for concurrent use; the
// mutating calls take a lock file in the bed's directory, so two processes
// acting on one bed wait for each other instead of interleaving. And a
// process the bed starts outlives the caller: it is reaped by the caller
// when the caller stops it, otherwise by init.
package testbed
