package testbed

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The defaults of the settings; docs/testbed.md lists them.
const (
	DefaultKafkaPort           = 19092
	DefaultKafkaControllerPort = 19093
	DefaultPGPort              = 15432
	DefaultKafkaHeap           = "-Xms256m -Xmx512m"
	// DefaultClusterHeap is each node's heap in a cluster (KafkaNodes > 1):
	// three JVMs share the machine with PostgreSQL and the tests.
	DefaultClusterHeap = "-Xms128m -Xmx384m"
	// MaxKafkaNodes bounds KafkaNodes: the nodes' ports are spaced by
	// NodePortStep from the first node's.
	MaxKafkaNodes = 9
	// NodePortStep is the distance between the ports of two consecutive
	// nodes of a cluster: node N listens on KafkaPort+NodePortStep*(N-1)
	// and its controller on KafkaControllerPort+NodePortStep*(N-1).
	NodePortStep             = 10
	DefaultKafkaStartTimeout = 120 * time.Second
	DefaultPGStartTimeout    = 60 * time.Second
	// DefaultStopTimeout is how long a stopped server has before SIGKILL.
	DefaultStopTimeout = 30 * time.Second
)

// The broker JVM's compilers (Config.KafkaJIT). JITClient, the default,
// stops HotSpot's tiered compilation at the client compiler (C1): the
// broker starts sooner and takes about half the CPU time for the same
// test load, which on two cores is time the tests get. Its compiled code
// is slower at the peak, so the benchmarks, which measure against the
// broker's peak, run it with JITTiered: C1, then C2 for the hot code.
const (
	JITClient = "c1"
	JITTiered = "tiered"
)

// Config is what a bed is set up from. FromEnv fills it from the TIDEMARK_*
// variables. A zero port means the port the running bed recorded, else the
// default; the other zero fields mean their defaults. Up applies the
// settings; Stop, Start and Restart start a service again as Up recorded it
// and read only the timeouts and Out.
type Config struct {
	// Root is the checkout: the broker's log4j2.xml and pom.xml are read
	// from Root/scripts/kafka. Required.
	Root string
	// Dir is where data, logs, jars and the state file are kept; default
	// Root/.testbed. A relative Dir is taken relative to Root.
	Dir string

	KafkaPort           int // the broker's client listener (node 1's in a cluster)
	KafkaControllerPort int // the KRaft controller listener (node 1's in a cluster)
	PGPort              int

	// KafkaNodes is the number of Kafka nodes Up starts: 1 (the default) is
	// one node that is broker and controller; more is a cluster of that
	// many nodes, each broker and controller, whose topics get three
	// replicas (or one per node, when fewer) and min.insync.replicas 2.
	// Zero means the running bed's count, else 1.
	KafkaNodes int

	// KafkaVersion is the Apache Kafka release the broker runs; its jars
	// must be in JarsDir(KafkaVersion) (scripts/testbed provision puts them
	// there). Default: the kafka.version of Root/scripts/kafka/pom.xml.
	KafkaVersion string
	// KafkaHeap are each broker JVM's heap flags; default DefaultKafkaHeap
	// for one node, DefaultClusterHeap for a cluster.
	KafkaHeap []string
	// KafkaJIT is how the broker JVM compiles: JITClient (HotSpot's client
	// compiler only) or JITTiered (HotSpot's default). Empty means the
	// running bed's, else JITClient.
	KafkaJIT string
	// JavaHome, when set, is the JDK or JRE to run Kafka with; otherwise
	// java on PATH.
	JavaHome string
	// PGBin is PostgreSQL's bin directory; default the newest
	// /usr/lib/postgresql/*/bin, else the directory of initdb on PATH.
	PGBin string

	KafkaStartTimeout time.Duration // until the broker serves
	PGStartTimeout    time.Duration // until PostgreSQL answers a query
	StopTimeout       time.Duration // from SIGTERM/SIGINT/SIGQUIT to SIGKILL

	// Out receives the progress lines ("testbed: ..."); nil discards them.
	Out io.Writer
}

// FromEnv returns the Config of the checkout at root from the environment
// as getenv reads it (os.Getenv in the command): TIDEMARK_TESTBED_DIR,
// TIDEMARK_KAFKA_PORT, TIDEMARK_KAFKA_CONTROLLER_PORT, TIDEMARK_PG_PORT,
// TIDEMARK_KAFKA_NODES, TIDEMARK_KAFKA_VERSION, TIDEMARK_KAFKA_HEAP,
// TIDEMARK_KAFKA_JIT, TIDEMARK_KAFKA_START_TIMEOUT
// and TIDEMARK_PG_START_TIMEOUT (seconds), TIDEMARK_PG_BIN and JAVA_HOME. A
// value that does not parse is an error naming the variable.
func FromEnv(root string, getenv func(string) string) (Config, error) {
	c := Config{Root: root, Dir: getenv("TIDEMARK_TESTBED_DIR"), PGBin: getenv("TIDEMARK_PG_BIN"),
		JavaHome: getenv("JAVA_HOME"), KafkaVersion: getenv("TIDEMARK_KAFKA_VERSION"), KafkaJIT: getenv("TIDEMARK_KAFKA_JIT")}
	var errs []error
	for _, p := range []struct {
		name string
		to   *int
	}{
		{"TIDEMARK_KAFKA_PORT", &c.KafkaPort},
		{"TIDEMARK_KAFKA_CONTROLLER_PORT", &c.KafkaControllerPort},
		{"TIDEMARK_PG_PORT", &c.PGPort},
	} {
		s := getenv(p.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			errs = append(errs, fmt.Errorf("%s=%q is not a port number (1-65535)", p.name, s))
			continue
		}
		*p.to = n
	}
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{
		{"TIDEMARK_KAFKA_START_TIMEOUT", &c.KafkaStartTimeout},
		{"TIDEMARK_PG_START_TIMEOUT", &c.PGStartTimeout},
	} {
		s := getenv(d.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q is not a number of seconds (at least 1)", d.name, s))
			continue
		}
		*d.to = time.Duration(n) * time.Second
	}
	if s := getenv("TIDEMARK_KAFKA_NODES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxKafkaNodes {
			errs = append(errs, fmt.Errorf("TIDEMARK_KAFKA_NODES=%q is not a number of Kafka nodes (1-%d)", s, MaxKafkaNodes))
		} else {
			c.KafkaNodes = n
		}
	}
	// Empty or unset: the default, as ${TIDEMARK_KAFKA_HEAP:-...} was.
	c.KafkaHeap = strings.Fields(getenv("TIDEMARK_KAFKA_HEAP"))
	if c.KafkaVersion != "" && !versionRE.MatchString(c.KafkaVersion) {
		errs = append(errs, fmt.Errorf("TIDEMARK_KAFKA_VERSION=%q is not a Kafka release such as 4.4.0", c.KafkaVersion))
	}
	if c.KafkaJIT != "" && c.KafkaJIT != JITClient && c.KafkaJIT != JITTiered {
		errs = append(errs, fmt.Errorf("TIDEMARK_KAFKA_JIT=%q is not %s (the client compiler only) or %s (HotSpot's default)", c.KafkaJIT, JITClient, JITTiered))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// versionRE is what a Kafka release looks like: it becomes part of a path.
var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([.-][A-Za-z0-9]+)*$`)

// withDefaults fills the zero fields that have defaults, resolves Dir and
// reads the Kafka version from the POM when none is set.
func (c Config) withDefaults() (Config, error) {
	if c.Root == "" {
		return c, errors.New("testbed: Config.Root is empty: the checkout is needed for scripts/kafka")
	}
	root, err := filepath.Abs(c.Root)
	if err != nil {
		return c, err
	}
	c.Root = root
	switch {
	case c.Dir == "":
		c.Dir = filepath.Join(c.Root, ".testbed")
	case !filepath.IsAbs(c.Dir):
		c.Dir = filepath.Join(c.Root, c.Dir)
	}
	c.Dir = filepath.Clean(c.Dir)
	if c.KafkaNodes < 0 || c.KafkaNodes > MaxKafkaNodes {
		return c, fmt.Errorf("testbed: Config.KafkaNodes %d: want 0 to %d", c.KafkaNodes, MaxKafkaNodes)
	}
	if len(c.KafkaHeap) == 0 {
		c.KafkaHeap = strings.Fields(DefaultKafkaHeap)
		if c.KafkaNodes > 1 {
			c.KafkaHeap = strings.Fields(DefaultClusterHeap)
		}
	}
	if c.KafkaStartTimeout <= 0 {
		c.KafkaStartTimeout = DefaultKafkaStartTimeout
	}
	if c.PGStartTimeout <= 0 {
		c.PGStartTimeout = DefaultPGStartTimeout
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c, nil
}

// pomVersion reads <kafka.version> from the POM: the default release, kept
// in the one file that scripts/testbed provision also reads.
func pomVersion(pom string) (string, error) {
	b, err := os.ReadFile(pom)
	if err != nil {
		return "", fmt.Errorf("the default Kafka version is read from %s: %w", pom, err)
	}
	m := pomVersionRE.FindSubmatch(b)
	if m == nil || !versionRE.Match(m[1]) {
		return "", fmt.Errorf("%s has no <kafka.version> such as 4.4.0", pom)
	}
	return string(m[1]), nil
}

var pomVersionRE = regexp.MustCompile(`<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>`)

// ports are the three listeners of a bed.
type ports struct{ kafka, controller, pg int }

// resolvePorts picks each port: the setting, else what st recorded, else
// the default. A service that runs keeps its recorded port: a setting that
// asks for another is an error, since the running server cannot move.
func (c Config) resolvePorts(st *State, kafkaRuns, pgRuns bool) (ports, error) {
	var rec ports
	if st != nil && st.Kafka != nil && len(st.Kafka.Nodes) > 0 {
		rec.kafka, rec.controller = st.Kafka.Nodes[0].Port, st.Kafka.Nodes[0].ControllerPort
	}
	if st != nil && st.Postgres != nil {
		rec.pg = st.Postgres.Port
	}
	pick := func(name string, set, recorded, def int, runs bool) (int, error) {
		if runs && set != 0 && set != recorded {
			return 0, fmt.Errorf("%s=%d, but the bed's server runs on %d: run scripts/testbed down first to move it", name, set, recorded)
		}
		if runs || set == 0 && recorded != 0 {
			return recorded, nil
		}
		if set != 0 {
			return set, nil
		}
		return def, nil
	}
	var p ports
	var errs []error
	var err error
	p.kafka, err = pick("TIDEMARK_KAFKA_PORT", c.KafkaPort, rec.kafka, DefaultKafkaPort, kafkaRuns)
	errs = append(errs, err)
	p.controller, err = pick("TIDEMARK_KAFKA_CONTROLLER_PORT", c.KafkaControllerPort, rec.controller, DefaultKafkaControllerPort, kafkaRuns)
	errs = append(errs, err)
	p.pg, err = pick("TIDEMARK_PG_PORT", c.PGPort, rec.pg, DefaultPGPort, pgRuns)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return ports{}, err
	}
	if p.kafka == p.controller || p.kafka == p.pg || p.controller == p.pg {
		return ports{}, fmt.Errorf("the three ports must differ: Kafka %d, controller %d, PostgreSQL %d", p.kafka, p.controller, p.pg)
	}
	return p, nil
}

// The layout of the bed's directory.

// JarsDir is where the jars of one Kafka release are kept (with a .stamp),
// shared by every start of that release: scripts/testbed provision fills
// it with Maven.
func JarsDir(dir, version string) string { return filepath.Join(dir, "jars", "kafka-"+version) }

func statePath(dir string) string { return filepath.Join(dir, "state.json") }
func envPath(dir string) string   { return filepath.Join(dir, "env") }
func lockPath(dir string) string  { return filepath.Join(dir, "lock") }
func nodeDir(dir string, id int32) string {
	return filepath.Join(dir, "kafka", "node-"+strconv.Itoa(int(id)))
}
func pgDir(dir string) string { return filepath.Join(dir, "pg") }

// FindRoot returns the checkout that dir is in: the nearest directory at or
// above dir that holds scripts/testbed.
func FindRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if fi, err := os.Stat(filepath.Join(d, "scripts", "testbed")); err == nil && !fi.IsDir() {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no scripts/testbed in %s or above it: not in a tidemark checkout", dir)
		}
		d = parent
	}
}
