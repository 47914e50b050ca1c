package testbed

import (
	"syscall"
	"time"
)

// The internals the external tests reach.

type Mark = mark
type Ports = ports

var (
	ServerProperties = serverProperties
	BrokerArgv       = brokerArgv
	FormatArgv       = formatArgv
	PostgresArgv     = postgresArgv
	InitdbArgv       = initdbArgv
	NewClusterID     = newClusterID
	JavaVersion      = javaVersion
	KafkaJars        = kafkaJars
	PomVersion       = pomVersion
	PGConf           = pgConf
	PGHBA            = pgHBA
	PGDataDir        = pgDataDir
	FindPGBin        = findPGBin
	EnvFileContent   = envFile
	LoadState        = loadState
	SaveState        = saveState
	StatePath        = statePath
	LockPath         = lockPath
	Lock             = lock
	Ours             = ours
	Exited           = exited
	PortFree         = portFree
	StartDetached    = startDetached
)

func PlanNodes(dir string, p Ports, nodes int) ([]Broker, error) { return planNodes(dir, p, nodes) }

func (m Mark) In(argv []string) bool           { return m.in(argv) }
func (n Broker) Mark() Mark                    { return n.mark() }
func (p *PostgresState) Mark() Mark            { return p.mark() }
func NewPorts(kafka, controller, pg int) Ports { return ports{kafka, controller, pg} }
func (p Ports) Values() (int, int, int)        { return p.kafka, p.controller, p.pg }

func (c Config) ResolvePorts(st *State, kafkaRuns, pgRuns bool) (Ports, error) {
	return c.resolvePorts(st, kafkaRuns, pgRuns)
}

func (c Config) WithDefaults() (Config, error) { return c.withDefaults() }

func StopProcess(pid int, m Mark, sig syscall.Signal, timeout time.Duration) (bool, error) {
	return stopProcess(pid, m, sig, timeout)
}
