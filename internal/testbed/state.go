package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// stateFormat is the version of state.json's layout; a file of another
// format is refused rather than half understood.
const stateFormat = 1

// State is what state.json records about a bed: enough to find, check,
// stop and start again every process Up started, without the settings.
// A PID of 0 means the process is not running (never started, or stopped
// by Stop).
type State struct {
	Format   int            `json:"format"`
	Dir      string         `json:"dir"`
	Kafka    *KafkaState    `json:"kafka,omitempty"`
	Postgres *PostgresState `json:"postgres,omitempty"`
}

// KafkaState is the Kafka cluster of a bed: one release, one cluster id,
// one or more nodes (one by default; KafkaNodes in Config).
type KafkaState struct {
	Version   string   `json:"version"`
	ClusterID string   `json:"cluster_id"`
	Java      string   `json:"java"`
	Jars      string   `json:"jars"`
	Log4j     string   `json:"log4j"`
	Heap      []string `json:"heap"`
	// JIT is the JVM's compilers (Config.KafkaJIT); empty in a state
	// written before the setting, whose brokers ran JITTiered.
	JIT   string   `json:"jit,omitempty"`
	Nodes []Broker `json:"nodes"`
}

// jit is the compilers the brokers run with.
func (k *KafkaState) jit() string {
	if k.JIT == "" {
		return JITTiered
	}
	return k.JIT
}

// Broker is one Kafka node: a JVM with its own configuration, data and
// logs.
type Broker struct {
	ID             int32    `json:"id"`
	Roles          []string `json:"roles"` // process.roles: broker, controller
	Port           int      `json:"port"`
	ControllerPort int      `json:"controller_port"`
	Dir            string   `json:"dir"`
	Config         string   `json:"config"` // server.properties; its path is in the JVM's command line
	Data           string   `json:"data"`   // log.dirs and the KRaft metadata
	Logs           string   `json:"logs"`   // server.log, kafka.out, format.out
	// DirID is the directory id of a controller of a cluster, given to the
	// format's --initial-controllers; empty for one node (--standalone).
	DirID string `json:"dir_id,omitempty"`
	PID   int    `json:"pid"`
	// Paused: Pause stopped the JVM with SIGSTOP and Resume has not yet
	// continued it.
	Paused bool `json:"paused,omitempty"`
}

// Addr is the broker's client address.
func (b Broker) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.Port) }

// PostgresState is the PostgreSQL server of a bed.
type PostgresState struct {
	Version string `json:"version"` // server_version, first word
	Bin     string `json:"bin"`
	Port    int    `json:"port"`
	Data    string `json:"data"` // its path is in the postmaster's command line
	Log     string `json:"log"`
	RunAs   string `json:"run_as,omitempty"` // the system user it runs as when we are root
	PID     int    `json:"pid"`
}

// Brokers returns the client addresses of st's Kafka nodes, comma-separated:
// TIDEMARK_KAFKA_BROKERS.
func (st *State) Brokers() string {
	if st == nil || st.Kafka == nil {
		return ""
	}
	addrs := make([]string, len(st.Kafka.Nodes))
	for i, n := range st.Kafka.Nodes {
		addrs[i] = n.Addr()
	}
	return strings.Join(addrs, ",")
}

// DSN returns the connection string of st's database: TIDEMARK_PG_DSN.
func (st *State) DSN() string {
	if st == nil || st.Postgres == nil {
		return ""
	}
	return pgDSN(st.Postgres.Port, pgDatabase)
}

const (
	pgUser     = "tidemark" // the superuser initdb creates
	pgDatabase = "tidemark"
)

// pgDSN is the connection string of database db on the bed's PostgreSQL.
func pgDSN(port int, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pgUser, port, db)
}

// loadState reads dir's state.json; (nil, nil) when there is none.
func loadState(dir string) (*State, error) {
	path := statePath(dir)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s is not a test bed state file (%v): move it away, stop the bed's servers by hand if they run", path, err)
	}
	if st.Format != stateFormat {
		return nil, fmt.Errorf("%s has format %d, this testbed reads format %d: stop that bed with the scripts/testbed that started it", path, st.Format, stateFormat)
	}
	return &st, nil
}

// saveState writes st to dir's state.json atomically (a temporary file
// renamed over it), so a reader never sees half a file and a crash never
// loses the pids already recorded.
func saveState(dir string, st *State) error {
	st.Format = stateFormat
	st.Dir = dir
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(statePath(dir), append(b, '\n'))
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// lock takes dir's lock file, waiting while another process holds it: Up,
// Down, Stop and Start of two processes on one bed would otherwise
// interleave. The lock goes with the process, so a killed holder frees it.
func lock(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lockPath(dir), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
