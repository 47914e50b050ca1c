package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Bed is the test bed of one directory. New makes one; the zero Bed is not
// usable. A Bed is not safe for concurrent use; the methods that change
// the bed take the directory's lock file, so other processes wait.
type Bed struct {
	cfg Config
	// heapDefault: Config.KafkaHeap was empty, so a cluster gets
	// DefaultClusterHeap whatever withDefaults chose.
	heapDefault bool
}

// Open returns the Bed of the checkout that the working directory is in,
// configured from the environment (FromEnv), with its progress lines going
// to out: what a test that drives the bed's verbs itself opens. It starts
// nothing.
func Open(out io.Writer) (*Bed, error) {
	root, err := FindRoot(".")
	if err != nil {
		return nil, err
	}
	cfg, err := FromEnv(root, os.Getenv)
	if err != nil {
		return nil, err
	}
	cfg.Out = out
	return New(cfg)
}

// New returns the Bed that cfg describes. It starts nothing.
func New(cfg Config) (*Bed, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Bed{cfg: c, heapDefault: len(cfg.KafkaHeap) == 0}, nil
}

// Dir is the bed's directory.
func (b *Bed) Dir() string { return b.cfg.Dir }

// EnvFile is the path of the file of export lines that Up writes.
func (b *Bed) EnvFile() string { return envPath(b.cfg.Dir) }

func (b *Bed) say(format string, args ...any) {
	fmt.Fprintf(b.cfg.Out, "testbed: "+format+"\n", args...)
}

// Kind is a kind of server of the bed.
type Kind int

// The servers of a bed.
const (
	Kafka Kind = iota + 1
	Postgres
)

// Service names one server of the bed, or all nodes of Kafka.
type Service struct {
	Kind Kind
	// Node is the Kafka node (its node.id); 0 means every node. Ignored
	// for Postgres.
	Node int32
}

// ParseService parses a service name: "kafka" (every Kafka node),
// "kafka-N" (node N) or "postgres".
func ParseService(s string) (Service, error) {
	switch {
	case s == "kafka":
		return Service{Kind: Kafka}, nil
	case s == "postgres":
		return Service{Kind: Postgres}, nil
	case strings.HasPrefix(s, "kafka-"):
		n, err := strconv.ParseInt(strings.TrimPrefix(s, "kafka-"), 10, 32)
		if err == nil && n > 0 {
			return Service{Kind: Kafka, Node: int32(n)}, nil
		}
	}
	return Service{}, fmt.Errorf("unknown service %q: want kafka, kafka-<node id> or postgres", s)
}

func (s Service) String() string {
	switch {
	case s.Kind == Postgres:
		return "postgres"
	case s.Kind == Kafka && s.Node == 0:
		return "kafka"
	case s.Kind == Kafka:
		return "kafka-" + strconv.Itoa(int(s.Node))
	}
	return "unknown"
}

// Mode is how Stop stops a server.
type Mode int

const (
	// Graceful is SIGTERM for Kafka (a controlled shutdown) and SIGINT for
	// PostgreSQL (fast shutdown), then SIGKILL after the stop timeout.
	Graceful Mode = iota
	// Crash is SIGKILL for Kafka (the broker recovers its logs at the next
	// start) and SIGQUIT for PostgreSQL (immediate shutdown: crash recovery
	// at the next start), which also gets SIGKILL after the stop timeout.
	Crash
)

// Up starts what of the bed does not run — a Kafka node with a freshly
// formatted log directory, PostgreSQL on a fresh data directory with the
// database created — waits until each serves, and writes the env file. A
// server the bed started earlier that runs and answers is left alone; one
// that runs and does not answer is an error. Every check (Java, the jars,
// PostgreSQL's programs, free ports) is made before anything starts. When
// Up fails it stops what it started; the logs stay. ctx bounds the whole
// call.
func (b *Bed) Up(ctx context.Context) (err error) {
	t0 := time.Now()
	unlock, err := lock(b.cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := b.refuseLegacy(); err != nil {
		return err
	}
	st, err := loadState(b.cfg.Dir)
	if err != nil {
		return err
	}
	if err := os.Remove(b.EnvFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	kafkaRuns, err := b.kafkaRuns(ctx, st)
	if err != nil {
		return err
	}
	pgRuns, err := b.pgRuns(ctx, st)
	if err != nil {
		return err
	}
	p, err := b.cfg.resolvePorts(st, kafkaRuns, pgRuns)
	if err != nil {
		return err
	}
	nodes := b.cfg.KafkaNodes
	if st != nil && st.Kafka != nil && len(st.Kafka.Nodes) > 0 {
		if kafkaRuns && nodes != 0 && nodes != len(st.Kafka.Nodes) {
			return fmt.Errorf("TIDEMARK_KAFKA_NODES=%d, but the bed's Kafka runs with %d nodes: run scripts/testbed down first", nodes, len(st.Kafka.Nodes))
		}
		if nodes == 0 {
			nodes = len(st.Kafka.Nodes)
		}
		if jit := b.cfg.KafkaJIT; kafkaRuns && jit != "" && jit != st.Kafka.jit() {
			return fmt.Errorf("TIDEMARK_KAFKA_JIT=%s, but the bed's Kafka runs with %s: run scripts/testbed down first", jit, st.Kafka.jit())
		}
	}
	if nodes == 0 {
		nodes = 1
	}
	if st == nil {
		st = &State{}
	}

	// Every check before anything starts.
	var k *KafkaState
	var pg *PostgresState
	var as runAs
	if !kafkaRuns {
		if k, err = b.planKafka(p, nodes); err != nil {
			return err
		}
		if b.heapDefault {
			k.Heap = strings.Fields(DefaultKafkaHeap)
			if nodes > 1 {
				k.Heap = strings.Fields(DefaultClusterHeap)
			}
		}
	}
	if !pgRuns {
		if pg, as, err = b.planPG(p); err != nil {
			return err
		}
	}

	// A failed Up stops what it started itself, so nothing is left behind.
	defer func() {
		if err == nil {
			return
		}
		if !kafkaRuns && st.Kafka != nil {
			_ = b.stopNodes(st.nodes(Service{Kind: Kafka}), Graceful, len(st.Kafka.Nodes))
		}
		if !pgRuns && st.Postgres != nil {
			_ = b.stopPG(st.Postgres, Graceful)
		}
		if st.running() {
			_ = saveState(b.cfg.Dir, st)
		} else {
			_ = os.Remove(statePath(b.cfg.Dir))
		}
	}()

	// The JVMs boot while PostgreSQL starts.
	var formatTook time.Duration
	kafkaAt := time.Now()
	if !kafkaRuns {
		st.Kafka = k
		if formatTook, err = b.launchKafka(ctx, st); err != nil {
			return err
		}
	}
	if !pgRuns {
		st.Postgres = pg
		if err := b.launchPG(ctx, st, as); err != nil {
			return err
		}
	}
	if !kafkaRuns {
		for _, n := range st.Kafka.Nodes {
			if err := waitKafka(ctx, st, n, b.cfg.KafkaStartTimeout-time.Since(kafkaAt)); err != nil {
				return err
			}
			if err := kafkaLogging(n, st.Kafka.Log4j); err != nil {
				return err
			}
			b.say("%s up (pid %d) on %s in %d ms (storage format %d ms); log: %s", b.kafkaName(st, n), n.PID, n.Addr(),
				time.Since(kafkaAt).Milliseconds(), formatTook.Milliseconds(), filepath.Join(n.Logs, "server.log"))
		}
	}
	if err := writeFileAtomic(b.EnvFile(), envFile(st, b.EnvFile())); err != nil {
		return err
	}
	b.say("ready in %d ms; now: source %s", time.Since(t0).Milliseconds(), b.EnvFile())
	fmt.Fprintf(b.cfg.Out, "export TIDEMARK_KAFKA_BROKERS='%s'\nexport TIDEMARK_PG_DSN='%s'\n", st.Brokers(), st.DSN())
	return nil
}

// envFile renders the export lines of st.
func envFile(st *State, path string) []byte {
	return fmt.Appendf(nil, "# Written by scripts/testbed up; removed by down. Use: source %s\nexport TIDEMARK_KAFKA_BROKERS='%s'\nexport TIDEMARK_PG_DSN='%s'\n",
		path, st.Brokers(), st.DSN())
}

// running reports whether any process st records is ours and alive.
func (st *State) running() bool {
	if st.Kafka != nil {
		for _, n := range st.Kafka.Nodes {
			if ours(n.PID, n.mark()) {
				return true
			}
		}
	}
	return st.Postgres != nil && ours(st.Postgres.PID, st.Postgres.mark())
}

// Down stops exactly the processes the state file records, after checking
// that each is still ours, and removes the env and state files; data and
// logs stay for reading (the next Up throws them away). It stops nothing
// when nothing runs, and says so. A bed that the bash scripts/testbed
// started before it was Go is stopped too, by its pid files.
func (b *Bed) Down(ctx context.Context) error {
	unlock, err := lock(b.cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := loadState(b.cfg.Dir)
	if err != nil {
		return err
	}
	var errs []error
	if st == nil {
		errs = append(errs, b.legacyDown())
	} else {
		if st.Kafka != nil {
			errs = append(errs, b.stopNodes(st.nodes(Service{Kind: Kafka}), Graceful, len(st.Kafka.Nodes)))
		}
		if st.Postgres != nil {
			errs = append(errs, b.stopPG(st.Postgres, Graceful))
		} else {
			b.say("PostgreSQL not running")
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The state stays, so that a second down tries again.
		if st != nil {
			_ = saveState(b.cfg.Dir, st)
		}
		return err
	}
	for _, f := range []string{b.EnvFile(), statePath(b.cfg.Dir)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (b *Bed) notRunning(name string, pid int) {
	if pid > 0 && !exited(pid) {
		b.say("%s not running (pid %d is another process now; left alone)", name, pid)
		return
	}
	b.say("%s not running", name)
}

// Stop stops one service of a bed that Up set up, keeping its data.
func (b *Bed) Stop(ctx context.Context, s Service, m Mode) error {
	return b.one(ctx, s, func(st *State) error { return b.stop(st, s, m) })
}

// Start starts one service of a bed that Up set up again, on its data and
// with the settings Up recorded, and waits as Up does. A service that runs
// and answers is left alone.
func (b *Bed) Start(ctx context.Context, s Service) error {
	return b.one(ctx, s, func(st *State) error { return b.start(ctx, st, s) })
}

// Restart is Stop then Start, under one hold of the lock.
func (b *Bed) Restart(ctx context.Context, s Service, m Mode) error {
	return b.one(ctx, s, func(st *State) error {
		if err := b.stop(st, s, m); err != nil {
			return err
		}
		return b.start(ctx, st, s)
	})
}

// one runs fn on the bed's state under the lock and saves the state
// afterwards, also when fn fails half-way.
func (b *Bed) one(ctx context.Context, s Service, fn func(*State) error) error {
	unlock, err := lock(b.cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := loadState(b.cfg.Dir)
	if err != nil {
		return err
	}
	if st == nil || st.Kafka == nil || st.Postgres == nil {
		return fail(fmt.Sprintf("no test bed was set up in %s (no %s): run scripts/testbed up first.", b.cfg.Dir, statePath(b.cfg.Dir)))
	}
	if s.Kind == Kafka && s.Node != 0 && st.node(s.Node) == nil {
		return fmt.Errorf("the bed has no Kafka node %d", s.Node)
	}
	err = fn(st)
	if serr := saveState(b.cfg.Dir, st); err == nil {
		err = serr
	}
	return err
}

func (st *State) node(id int32) *Broker {
	for i := range st.Kafka.Nodes {
		if st.Kafka.Nodes[i].ID == id {
			return &st.Kafka.Nodes[i]
		}
	}
	return nil
}

// nodes returns the Kafka nodes s names.
func (st *State) nodes(s Service) []*Broker {
	if s.Node != 0 {
		return []*Broker{st.node(s.Node)}
	}
	ns := make([]*Broker, len(st.Kafka.Nodes))
	for i := range st.Kafka.Nodes {
		ns[i] = &st.Kafka.Nodes[i]
	}
	return ns
}

func (b *Bed) stop(st *State, s Service, m Mode) error {
	if s.Kind == Postgres {
		return b.stopPG(st.Postgres, m)
	}
	return b.stopNodes(st.nodes(s), m, len(st.Kafka.Nodes))
}

func (b *Bed) start(ctx context.Context, st *State, s Service) error {
	if s.Kind == Postgres {
		return b.startPG(ctx, st)
	}
	return b.startNodes(ctx, st, st.nodes(s))
}
