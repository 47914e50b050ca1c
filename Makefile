# tidemark — the two commands of the README:
#
#   make demo   start the test bed (Kafka + PostgreSQL) and run the demo job
#   make test   vet, unit tests, then the integration tests on the test bed,
#               which is stopped afterwards (also on failure). CI runs this.
#
# The other targets are the steps of those two. docs/testbed.md explains the
# test bed.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# The packages vet and unit look at: `work` is every package of every module
# in go.work (the library at the root, cmd/tidemark-bench, examples, tools); ./...
# at the root would stop at the nested modules. Narrow them while
# iterating, e.g. make unit PKGS=./pkg/watermark/...
PKGS ?= work
# The modules of go.work, each checked on its own by make vet (mod-check,
# which also fails when this list and go.work's differ).
MODULES := . cmd/tidemark-bench examples tools
# This checkout's workspace, whatever the environment says: with GOWORK=off
# `work` would be the library's packages alone, and the other modules'
# tests would not run (mod-check turns it off on purpose, per module).
export GOWORK := $(CURDIR)/go.work
TESTBED := scripts/testbed
# Where scripts/testbed writes the export lines (it honours TIDEMARK_TESTBED_DIR,
# a relative one taken relative to the checkout, which is make's directory).
BED_ENV = $${TIDEMARK_TESTBED_DIR:-.testbed}/env
UNIT_TIMEOUT ?= 10m
# A guard against a hang, not a speed target: the integration package under
# -race took 8 minutes with other work running (load average 6) and passed
# 12 minutes with both cores saturated by other work (load average 10).
INTEGRATION_TIMEOUT ?= 18m

# Integration tests: everything under ./integration, plus any other package
# with a test file whose //go:build line names the integration tag.
INTEGRATION_PKGS := ./integration/... $(sort $(patsubst %/,%,$(dir $(shell \
	grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=.testbed \
		'^//go:build.*\bintegration\b' . 2>/dev/null | grep -v '^\./integration/'))))
# The chaos suite restarts the bed's broker and database, so it runs alone,
# after the other integration tests (docs/chaos.md). CHAOS_DURATION is its
# fault phase in make test; make soak DURATION=10m runs it for longer.
# CHAOS=0 leaves it out (it restarts the servers of scripts/testbed's bed
# through internal/testbed, so it cannot run on your own Kafka and
# PostgreSQL).
CHAOS_PKG := ./integration/chaos
CHAOS ?= 1
CHAOS_DURATION ?= 75s
DURATION ?= 10m
SOAK_TIMEOUT ?= 4h
# make soak CLUSTER=3: TestChaos on a bed of three Kafka nodes, where it
# deals the broker faults (integration/chaos/brokerfaults_test.go) beside
# all the others; the test fails when the bed has another number of nodes.
# Without CLUSTER the soak runs on the bed that is up, or on a new one of
# TIDEMARK_KAFKA_NODES (default one) nodes.
CLUSTER ?=
SOAK_ENV := $(if $(CLUSTER),TIDEMARK_KAFKA_NODES=$(CLUSTER))

.PHONY: help test vet mod-check unit integration soak sim chaos-cluster bench demo quickstart testbed-up testbed-down testbed-status

help:
	@echo 'make demo            test bed up, then the orders demo (examples/orders/demo)'
	@echo 'make bench           test bed up, then the benchmark harness: docs/bench/bench.json and its plots'
	@echo 'make test            vet + unit tests + integration tests on the test bed (what CI runs)'
	@echo 'make vet             go vet, with and without the integration tag, mod-check, promtool on deploy/'
	@echo 'make mod-check       every go.mod tidy and complete on its own, without go.work'
	@echo 'make unit            go test -race work: every module of go.work (no servers)'
	@echo 'make integration     integration tests against a running bed (.testbed/env or TIDEMARK_* variables)'
	@echo 'make soak            the chaos suite for DURATION (default 10m) on the test bed (docs/chaos.md)'
	@echo 'make soak CLUSTER=3  every fault, the broker faults too, on a three-node bed for DURATION'
	@echo 'make sim             the seeded simulations for DURATION (default 10m); SEED=N replays one'
	@echo 'make chaos-cluster   one round of every fault on a three-node cluster bed (not in make test)'
	@echo 'make testbed-up      scripts/testbed up (provisions first: packages as root, the Kafka jars)'
	@echo 'make testbed-down    scripts/testbed down'
	@echo 'make testbed-status  scripts/testbed status'

# scripts/test runs the phases side by side where it can: the test
# binaries are built while three beds start, then the integration tests
# (in parallel, under -race) and the memory tests (without it) on the
# first, the volume tests (without it) on the second, the serial tests and
# the chaos suite on the third, and vet and the unit tests beside them. Each phase's log and go
# test's events go to .testbed/results; at the end it prints each phase's
# wall time and the ten slowest tests, warns past 6 minutes and fails past
# 12 (docs/testbed.md, "make test"). The beds it started are stopped
# afterwards, also on failure; a bed that was up and answering before is
# left running. The exit status is 1 when any phase failed.
test:
	@scripts/test all

# scripts/promtool-check: promtool on deploy/prometheus's rules (check and
# unit tests) and on the dashboard's queries; under a second once promtool
# is there (its first run fetches Debian's prometheus package, 19 MB).
vet: mod-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt: not formatted (run gofmt -w):"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags integration $(INTEGRATION_PKGS)
	$(GO) vet -tags tidemark_unsafe ./pkg/inbox/ ./examples/orders/...
	scripts/promtool-check

# In workspace mode a package may import a module that only a sibling
# module requires: the library would build here and not for its users.
# Each module is therefore checked alone (GOWORK=off): its go.mod must be
# exactly what go mod tidy writes, every build tag included.
mod-check:
	@used=$$($(GO) list -m -f '{{.Dir}}' | sed 's|^$(CURDIR)/*||; s|^$$|.|' | sort | xargs); \
	listed=$$(printf '%s\n' $(MODULES) | sort | xargs); \
	[ "$$used" = "$$listed" ] || { echo "make mod-check: go.work uses [$$used], the Makefile's MODULES are [$$listed]: make them agree" >&2; exit 1; }
	@for m in $(MODULES); do \
		(cd "$$m" && GOWORK=off $(GO) mod tidy -diff) || \
			{ echo "make mod-check: $$m/go.mod is not tidy: (cd $$m && GOWORK=off $(GO) mod tidy)" >&2; exit 1; }; \
	done

# Every package of every module of go.work under -race (PKGS narrows it),
# then the packages with a tidemark_unsafe test hook, built with it (the
# chaos suite's proof that its duplicate check bites).
unit:
	@PKGS='$(PKGS)' UNIT_TIMEOUT=$(UNIT_TIMEOUT) scripts/test unit

# Uses TIDEMARK_* from the environment, else .testbed/env when it exists;
# without either the tests fail and say how to start the bed. The phases
# of make test on one bed: the parallel and the -race-less ones side by
# side, then the serial tests and the chaos suite, which change or restart
# the bed's servers, alone. scripts/statuspage provision installs the
# Chromium that TestStatusPageInChromium opens the status page in.
integration:
	@CHAOS=$(CHAOS) CHAOS_DURATION=$(CHAOS_DURATION) INTEGRATION_TIMEOUT=$(INTEGRATION_TIMEOUT) scripts/test integration

# The chaos suite as a soak: DURATION of faults (make soak DURATION=30m),
# then the proof run that its duplicate check bites; with CLUSTER, the
# cluster bed's verbs test first (TestClusterVerbs: replication, kills,
# pause, rolling restart). Starts the bed like make test and stops it
# afterwards unless it was already running. TIDEMARK_CHAOS_SEED replays a
# run, TIDEMARK_CHAOS_SUMMARY names a JSON file for the summary.
soak:
	@status=0; was_up=; \
	if $(TESTBED) status >/dev/null 2>&1; then was_up=1; fi; \
	{ $(SOAK_ENV) $(TESTBED) up && . "$(BED_ENV)" && \
		{ [ -z "$(filter-out 1,$(CLUSTER))" ] || $(GO) test -count=1 -v -tags 'integration cluster' -run '^TestClusterVerbs$$' \
			-timeout 20m ./internal/testbed/; } && \
		TIDEMARK_CHAOS_NODES=$(CLUSTER) TIDEMARK_CHAOS_DURATION=$(DURATION) $(GO) test -race -count=1 -v -tags integration \
			-run '^(TestChaos|TestStrictCheckBites)$$' -timeout $(SOAK_TIMEOUT) $(CHAOS_PKG); } || status=$$?; \
	if [ -z "$$was_up" ]; then $(TESTBED) down || true; fi; \
	exit $$status

# One round of every fault on the three-node cluster (each kind once; a
# rolling restart is three): the short cluster run. Not part of make test,
# which it would push past 20 minutes on two cores (docs/chaos.md).
chaos-cluster:
	@$(MAKE) --no-print-directory soak CLUSTER=3 DURATION=0s

# The main job: the orders example on the bed — 100,000 orders, two
# instances in one group, one stopped with SIGTERM halfway and restarted,
# then every order checked against the topic (examples/orders/demo).
demo: testbed-up
	@. "$(BED_ENV)" && $(GO) run ./examples/orders/demo
	@echo 'The test bed is still running: scripts/testbed status | down'

# The benchmarks of docs/performance.md: every workload against its
# baselines in one run on the bed (its broker with HotSpot's full JIT, as
# in production: TIDEMARK_KAFKA_JIT=tiered; a bed already up with the
# tests' client compiler is refused: scripts/testbed down first), the table on stdout, the report and the
# scaling curves into docs/bench (about 10 minutes on 2 cores: 5 before
# the partition-scaling workload, which takes 4-6). The bed is
# left running, as by make demo. BENCH_FLAGS adds or overrides flags.
BENCH_FLAGS ?=
bench:
	TIDEMARK_KAFKA_JIT=tiered $(TESTBED) up
	@. "$(BED_ENV)" && time $(GO) run ./cmd/tidemark-bench -workload all -repeat 5 \
		-json docs/bench/bench.json -plots docs/bench $(BENCH_FLAGS)
	@echo 'The test bed is still running: scripts/testbed status | down'

# The seeded simulations (internal/simtest): make test runs their fixed
# seeds in make unit; make sim runs new seeds for DURATION (default 10m)
# and prints a summary of seeds, steps and faults, or stops at the first
# failing seed. make sim SEED=N runs seed N alone; SIM=share, SIM=group or
# SIM=franz picks one simulation (all three without).
SIM ?=
SEED ?=
SIM_TESTS := $(if $(filter share,$(SIM)),TestSimShare,$(if $(filter group,$(SIM)),TestSimGroupRunner,$(if $(filter franz,$(SIM)),TestSimGroupFranz,TestSimShare|TestSimGroupRunner|TestSimGroupFranz)))
SIM_PKGS := $(if $(filter share,$(SIM)),./pkg/source/share/,$(if $(filter group,$(SIM)),./pkg/runner/,$(if $(filter franz,$(SIM)),./pkg/source/franz/,./pkg/source/share/ ./pkg/runner/ ./pkg/source/franz/)))
sim:
	$(GO) test -race -count=1 -v -run '^($(SIM_TESTS))$$' -timeout 0 $(SIM_PKGS) \
		$(if $(SEED),-sim.seed=$(SEED),-sim.duration=$(DURATION)) | grep -E '^(---|ok|FAIL)|simulation[:,]|_test.go:[0-9]+: '

# The smallest tidemark program (examples/quickstart): 10,000 orders produced,
# consumed by a runner through the inbox, a summary; exit 1 if it does not add up.
quickstart: testbed-up
	@. "$(BED_ENV)" && $(GO) run ./examples/quickstart

testbed-up:
	$(TESTBED) up

testbed-down:
	$(TESTBED) down

testbed-status:
	$(TESTBED) status
