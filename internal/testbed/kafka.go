package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaRuns reports whether st's Kafka runs and answers: false when none of
// its nodes runs, an error when some do not or it does not answer.
func (b *Bed) kafkaRuns(ctx context.Context, st *State) (bool, error) {
	if st == nil || st.Kafka == nil || len(st.Kafka.Nodes) == 0 {
		return false, nil
	}
	var up []string
	for _, n := range st.Kafka.Nodes {
		if ours(n.PID, n.mark()) {
			up = append(up, strconv.Itoa(n.PID))
		}
	}
	switch {
	case len(up) == 0:
		return false, nil
	case len(up) < len(st.Kafka.Nodes):
		return false, fail(fmt.Sprintf("%d of the bed's %d Kafka nodes run (pids %s).", len(up), len(st.Kafka.Nodes), strings.Join(up, ", ")),
			"Run scripts/testbed start kafka, or scripts/testbed down && scripts/testbed up.")
	}
	if err := kafkaAnswers(ctx, st); err != nil {
		return false, fail(fmt.Sprintf("a Kafka broker started earlier (pid %s) runs but does not answer on %s: %v", strings.Join(up, ", "), st.Brokers(), err),
			"Read "+filepath.Join(st.Kafka.Nodes[0].Logs, "server.log")+", or run: scripts/testbed down && scripts/testbed up")
	}
	b.say("Kafka %s already running (pid %s) on %s", st.Kafka.Version, strings.Join(up, ", "), st.Brokers())
	return true, nil
}

// planKafka checks what a Kafka start needs and returns the cluster to
// start: nodes nodes, each broker and controller (one node: the bed's
// default). Node N listens on p.kafka+NodePortStep*(N-1) and its
// controller on p.controller+NodePortStep*(N-1).
func (b *Bed) planKafka(p ports, nodes int) (*KafkaState, error) {
	java, err := findJava(b.cfg.JavaHome)
	if err != nil {
		return nil, err
	}
	version := b.cfg.KafkaVersion
	if version == "" {
		if version, err = pomVersion(filepath.Join(b.cfg.Root, "scripts", "kafka", "pom.xml")); err != nil {
			return nil, err
		}
	}
	jars := JarsDir(b.cfg.Dir, version)
	if err := kafkaJars(jars, version); err != nil {
		return nil, err
	}
	log4j := filepath.Join(b.cfg.Root, "scripts", "kafka", "log4j2.xml")
	if _, err := os.Stat(log4j); err != nil {
		return nil, fmt.Errorf("the broker's logging configuration: %w", err)
	}
	ns, err := planNodes(b.cfg.Dir, p, nodes)
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		for _, pv := range []struct {
			port int
			name string
		}{{n.Port, "TIDEMARK_KAFKA_PORT"}, {n.ControllerPort, "TIDEMARK_KAFKA_CONTROLLER_PORT"}} {
			if err := portFree(pv.port); err != nil {
				what := "Kafka"
				if nodes > 1 {
					what = fmt.Sprintf("Kafka node %d", n.ID)
				}
				return nil, fail(err.Error()+", so "+what+" cannot listen there.",
					"Stop that process, or pick another port: "+pv.name+"=<port> scripts/testbed up")
			}
		}
	}
	jit := b.cfg.KafkaJIT
	if jit == "" {
		jit = JITClient
	}
	return &KafkaState{
		Version: version, ClusterID: newClusterID(), Java: java, Jars: jars, Log4j: log4j, Heap: b.cfg.KafkaHeap,
		JIT: jit, Nodes: ns,
	}, nil
}

// planNodes lays out nodes Kafka nodes with ids 1..nodes in dir, their ports
// spaced by NodePortStep from p's. Every port, PostgreSQL's included, must
// differ. The controllers of a cluster get a directory id each, for the
// format's --initial-controllers.
func planNodes(dir string, p ports, nodes int) ([]Broker, error) {
	if nodes < 1 || nodes > MaxKafkaNodes {
		return nil, fmt.Errorf("%d Kafka nodes: want 1 to %d", nodes, MaxKafkaNodes)
	}
	used := map[int]string{p.pg: "PostgreSQL"}
	var ns []Broker
	for i := range nodes {
		id := int32(i + 1)
		d := nodeDir(dir, id)
		n := Broker{
			ID: id, Roles: []string{"broker", "controller"},
			Port: p.kafka + NodePortStep*i, ControllerPort: p.controller + NodePortStep*i,
			Dir: d, Config: filepath.Join(d, "server.properties"),
			Data: filepath.Join(d, "data"), Logs: filepath.Join(d, "logs"),
		}
		if nodes > 1 {
			n.DirID = newClusterID()
		}
		for _, pv := range []struct {
			port int
			what string
		}{{n.Port, fmt.Sprintf("Kafka node %d", id)}, {n.ControllerPort, fmt.Sprintf("Kafka node %d's controller", id)}} {
			if pv.port > 65535 {
				return nil, fmt.Errorf("%s would listen on port %d: pick lower ports (TIDEMARK_KAFKA_PORT, TIDEMARK_KAFKA_CONTROLLER_PORT)", pv.what, pv.port)
			}
			if other, dup := used[pv.port]; dup {
				return nil, fmt.Errorf("%s and %s would both listen on port %d: pick other ports (node N uses TIDEMARK_KAFKA_PORT+%d(N-1) and TIDEMARK_KAFKA_CONTROLLER_PORT+%d(N-1))",
					other, pv.what, pv.port, NodePortStep, NodePortStep)
			}
			used[pv.port] = pv.what
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// launchKafka formats every node's storage afresh (the nodes in parallel:
// each format is a JVM of its own) and starts the JVMs, recording each pid
// as soon as it runs. It does not wait for readiness.
func (b *Bed) launchKafka(ctx context.Context, st *State) (format time.Duration, err error) {
	k := st.Kafka
	for i := range k.Nodes {
		n := &k.Nodes[i]
		if err := os.RemoveAll(n.Dir); err != nil {
			return 0, err
		}
		for _, d := range []string{n.Data, n.Logs} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return 0, err
			}
		}
		if err := os.WriteFile(n.Config, serverProperties(k.Version, *n, k.Nodes), 0o644); err != nil {
			return 0, err
		}
	}
	t := time.Now()
	fctx, cancel := context.WithTimeout(ctx, b.cfg.KafkaStartTimeout)
	errs := make([]error, len(k.Nodes))
	var wg sync.WaitGroup
	for i, n := range k.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := filepath.Join(n.Logs, "format.out")
			if err := runLogged(fctx, formatArgv(k, n), out, nil); err != nil {
				errs[i] = fail("formatting the Kafka storage failed: "+err.Error(), "Read "+out, tail(out, 20))
			}
		}()
	}
	wg.Wait()
	cancel()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	format = time.Since(t)
	for i := range k.Nodes {
		n := &k.Nodes[i]
		if n.PID, err = startDetached(brokerArgv(k, *n), n.Dir, filepath.Join(n.Logs, "kafka.out"), nil); err != nil {
			return 0, fmt.Errorf("start the Kafka JVM: %w", err)
		}
		if err := saveState(b.cfg.Dir, st); err != nil {
			return 0, err
		}
	}
	return format, nil
}

// startNodes starts the JVMs of ns that do not run, on their data, and
// waits until the cluster serves.
func (b *Bed) startNodes(ctx context.Context, st *State, ns []*Broker) error {
	t0 := time.Now()
	k := st.Kafka
	var started []*Broker
	for _, n := range ns {
		if ours(n.PID, n.mark()) {
			if n.Paused {
				if err := b.resumeNode(n, len(k.Nodes)); err != nil {
					return err
				}
				started = append(started, n)
			}
			continue
		}
		n.PID, n.Paused = 0, false
		if _, err := os.Stat(filepath.Join(n.Data, "meta.properties")); err != nil {
			return fail("no formatted Kafka storage in " + n.Data + ": run scripts/testbed up (which formats it) first.")
		}
		if !isExecutable(k.Java) {
			return fail(k.Java+", which started Kafka at up, is not there any more.", "Run scripts/testbed down && scripts/testbed up.")
		}
		// The old broker's sockets may take a moment to close.
		if err := waitPortsFree(5*time.Second, n.Port, n.ControllerPort); err != nil {
			return fail(err.Error()+", so Kafka cannot listen there.", "Stop that process.")
		}
		pid, err := startDetached(brokerArgv(k, *n), n.Dir, filepath.Join(n.Logs, "kafka.out"), nil)
		if err != nil {
			return fmt.Errorf("start the Kafka JVM: %w", err)
		}
		n.PID = pid
		started = append(started, n)
		if err := saveState(b.cfg.Dir, st); err != nil {
			return err
		}
	}
	if len(started) == 0 {
		if err := kafkaAnswers(ctx, st); err != nil {
			return fail(fmt.Sprintf("Kafka runs but does not answer on %s: %v", st.Brokers(), err),
				"Read "+filepath.Join(ns[0].Logs, "server.log")+", or run: scripts/testbed restart kafka")
		}
		b.say("Kafka %s already running on %s", k.Version, st.Brokers())
		return nil
	}
	for _, n := range started {
		if err := waitKafka(ctx, st, *n, b.cfg.KafkaStartTimeout-time.Since(t0)); err != nil {
			return err
		}
		b.say("%s started again (pid %d) on %s in %d ms; log: %s", b.kafkaName(st, *n), n.PID, n.Addr(),
			time.Since(t0).Milliseconds(), filepath.Join(n.Logs, "server.log"))
	}
	return nil
}

// stopNodes stops the JVMs of nodes ns of a cluster of nodes nodes and
// clears their pids: SIGTERM (a controlled shutdown) then SIGKILL after the
// stop timeout, or SIGKILL at once under Crash. The nodes are signalled at
// once and waited for together: a node's controlled shutdown needs the
// controller quorum, so the last of nodes stopped one after the other
// would wait out the stop timeout with its voters gone and get SIGKILL. A
// paused node is continued first. A node that fails to stop keeps its pid
// recorded; the others are stopped all the same.
func (b *Bed) stopNodes(ns []*Broker, m Mode, nodes int) error {
	var errs []error
	var run []*Broker
	for _, n := range ns {
		name := nodeName(n, nodes)
		if !ours(n.PID, n.mark()) {
			b.notRunning(name, n.PID)
			n.PID = 0
			continue
		}
		if n.Paused {
			// A stopped process does not act on SIGTERM until it runs again.
			if err := b.resumeNode(n, nodes); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if m == Crash {
			b.say("killing %s (pid %d, SIGKILL)", name, n.PID)
		} else {
			b.say("stopping %s (pid %d)", name, n.PID)
		}
		run = append(run, n)
	}
	sig, timeout := syscall.SIGTERM, b.cfg.StopTimeout
	if m == Crash {
		sig, timeout = syscall.SIGKILL, 10*time.Second
	}
	// The goroutines only signal and wait; the output and the state are
	// written here, after them.
	killed := make([]bool, len(run))
	stopErrs := make([]error, len(run))
	var wg sync.WaitGroup
	for i, n := range run {
		wg.Add(1)
		go func() {
			defer wg.Done()
			killed[i], stopErrs[i] = stopProcess(n.PID, n.mark(), sig, timeout)
		}()
	}
	wg.Wait()
	for i, n := range run {
		name := nodeName(n, nodes)
		if killed[i] {
			b.say("%s (pid %d) was still running after %s; sent SIGKILL", name, n.PID, timeout)
		}
		if stopErrs[i] != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", name, stopErrs[i])) // the pid stays recorded
			continue
		}
		n.PID = 0
	}
	return errors.Join(errs...)
}

func (b *Bed) kafkaName(st *State, n Broker) string {
	if len(st.Kafka.Nodes) > 1 {
		return fmt.Sprintf("Kafka %s node %d", st.Kafka.Version, n.ID)
	}
	return "Kafka " + st.Kafka.Version
}

// findJava returns the java to run Kafka with and its major version, which
// must be 17 or newer.
func findJava(javaHome string) (string, error) {
	const hint = "Install a JDK (Debian: apt-get install -y openjdk-17-jre-headless; scripts/testbed up does as root) or set JAVA_HOME."
	java := ""
	if javaHome != "" {
		if p := filepath.Join(javaHome, "bin", "java"); isExecutable(p) {
			java = p
		}
	}
	if java == "" {
		p, err := exec.LookPath("java")
		if err != nil {
			return "", fail("java not found: Kafka 4.x needs Java 17 or newer.", hint)
		}
		java = p
	}
	out, _ := exec.Command(java, "-version").CombinedOutput()
	v, major := javaVersion(out)
	if major < 17 {
		if v == "" {
			v = "of unknown version"
		}
		return "", fail(fmt.Sprintf("%s is Java %s; Kafka 4.x needs Java 17 or newer.", java, v), hint)
	}
	return java, nil
}

// kafkaJars checks that dir holds the broker's jars of version.
func kafkaJars(dir, version string) error {
	if _, err := os.Stat(filepath.Join(dir, "kafka_2.13-"+version+".jar")); err != nil {
		return fail(fmt.Sprintf("the jars of Kafka %s are not in %s.", version, dir),
			"Run scripts/testbed provision (scripts/testbed up does it first): it fetches them with Maven.")
	}
	return nil
}

// kafkaReady makes one attempt, bounded by ctx, to see that the cluster at
// brokers really serves requests: a Metadata request lists want brokers
// and a controller, a validate-only CreateTopics is accepted (the
// controller path), and FindCoordinator finds a group and a transaction
// coordinator, and with share groups (share > 0) a share coordinator. The
// last steps make the broker create __consumer_offsets,
// __transaction_state and __share_group_state now, so the first test that
// uses a group, a transaction or a share group does not pay for it (or
// time out waiting for it).
func kafkaReady(ctx context.Context, brokers []string, want, share int) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DialTimeout(time.Second),
		// One attempt: the caller's loop retries and watches the process.
		kgo.RequestRetries(0),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if len(md.Brokers) < want {
		return fmt.Errorf("metadata: %d of %d brokers registered", len(md.Brokers), want)
	}
	if md.Controller < 0 {
		return errors.New("metadata: no controller yet")
	}
	created, err := adm.ValidateCreateTopics(ctx, 1, 1, nil, "tidemark-ready-probe")
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		return fmt.Errorf("validate create topic: %w", err)
	}
	if err := adm.FindGroupCoordinators(ctx, "tidemark-ready-probe").Error(); err != nil {
		return fmt.Errorf("group coordinator: %w", err)
	}
	if err := adm.FindTxnCoordinators(ctx, "tidemark-ready-probe").Error(); err != nil {
		return fmt.Errorf("transaction coordinator: %w", err)
	}
	if share > 0 {
		// A share-partition key: group, topic id (any), partition.
		if err := adm.FindShareCoordinators(ctx, "tidemark-ready-probe:"+shareProbeTopicID+":0").Error(); err != nil {
			return fmt.Errorf("share coordinator: %w", err)
		}
	}
	return nil
}

// shareProbeTopicID is a topic id for the share-coordinator probe, in
// Kafka's form (unpadded URL-safe base64 of 16 bytes); no topic has it.
const shareProbeTopicID = "dGlkZW1hcmstcmVhZHkhIQ"

// kafkaAnswers is one readiness attempt of at most 3 s on st's cluster.
func kafkaAnswers(ctx context.Context, st *State) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return kafkaReady(ctx, strings.Split(st.Brokers(), ","), len(st.Kafka.Nodes), shareVersion(st.Kafka.Version))
}

// waitKafka waits until st's cluster serves (kafkaReady) while node n's
// JVM runs, within timeout.
func waitKafka(ctx context.Context, st *State, n Broker, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if exited(n.PID) {
			return fail("the Kafka broker exited while starting.",
				"Read "+filepath.Join(n.Logs, "server.log")+" and "+filepath.Join(n.Logs, "kafka.out"),
				tail(filepath.Join(n.Logs, "server.log"), 30), tail(filepath.Join(n.Logs, "kafka.out"), 20))
		}
		err := kafkaAnswers(ctx, st)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fail(fmt.Sprintf("the Kafka broker (pid %d) did not serve requests within %s: %v", n.PID, timeout, err),
				"Read "+filepath.Join(n.Logs, "server.log")+"; raise TIDEMARK_KAFKA_START_TIMEOUT on a slow machine.",
				tail(filepath.Join(n.Logs, "server.log"), 30))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// kafkaLogging checks that node n's SLF4J binding loaded and the broker
// logs to its file: without the binding Kafka logs nothing at all.
func kafkaLogging(n Broker, log4j string) error {
	out := filepath.Join(n.Logs, "kafka.out")
	if b, _ := os.ReadFile(out); regexp.MustCompile(`(?m)^SLF4J:`).Match(b) {
		return fail("the broker's SLF4J binding did not load, so it logs nothing (see scripts/kafka/pom.xml).",
			"Read "+out, tail(out, 20))
	}
	server := filepath.Join(n.Logs, "server.log")
	if b, _ := os.ReadFile(server); !bytes.Contains(b, []byte("Kafka Server started")) {
		return fail(fmt.Sprintf("the broker serves requests but %s has no 'Kafka Server started' line: logging is misconfigured.", server),
			"Check "+log4j+" and "+out)
	}
	return nil
}
