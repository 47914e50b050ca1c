package testbed

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A bed started by scripts/testbed before the lifecycle moved to Go has no
// state.json: it recorded its pids in kafka/kafka.pid and pg/postgres.pid
// (the data directory in pg/datadir) and its ports in ports. Down stops
// such a bed, with the same ownership checks, so a checkout that still
// runs one is not left with servers nothing can stop; Up refuses to start
// beside it and Status reports it.

// legacyProc is one process of an old bed.
type legacyProc struct {
	name string
	pid  int
	mark mark
	sig  syscall.Signal
	file string // its pid file
}

// legacyProcs returns the processes of an old bed in dir that still run
// and are ours.
func legacyProcs(dir string) []legacyProc {
	readPID := func(f string) int {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	var ps []legacyProc
	kpid := filepath.Join(dir, "kafka", "kafka.pid")
	k := legacyProc{name: "Kafka", pid: readPID(kpid), sig: syscall.SIGTERM, file: kpid,
		mark: mark{kafkaMain, filepath.Join(dir, "kafka", "server.properties")}}
	if ours(k.pid, k.mark) {
		ps = append(ps, k)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "pg", "datadir")); err == nil {
		ppid := filepath.Join(dir, "pg", "postgres.pid")
		p := legacyProc{name: "PostgreSQL", pid: readPID(ppid), sig: syscall.SIGINT, file: ppid,
			mark: mark{"-D", strings.TrimSpace(string(data))}}
		if ours(p.pid, p.mark) {
			ps = append(ps, p)
		}
	}
	return ps
}

// refuseLegacy fails when an old bed runs in the bed's directory: its
// servers hold the ports and only Down stops them.
func (b *Bed) refuseLegacy() error {
	ps := legacyProcs(b.cfg.Dir)
	if len(ps) == 0 {
		return nil
	}
	var what []string
	for _, p := range ps {
		what = append(what, p.name+" pid "+strconv.Itoa(p.pid))
	}
	return fail("a bed started by the bash scripts/testbed of before runs in "+b.cfg.Dir+" ("+strings.Join(what, ", ")+").",
		"Run scripts/testbed down (it stops that bed too), then scripts/testbed up.")
}

// legacyDown stops an old bed's processes and removes its pid, ports and
// env files.
func (b *Bed) legacyDown() error {
	ps := legacyProcs(b.cfg.Dir)
	if len(ps) == 0 {
		b.say("Kafka not running")
		b.say("PostgreSQL not running")
	}
	for _, p := range ps {
		b.say("stopping %s (pid %d, started by the old scripts/testbed)", p.name, p.pid)
		killed, err := stopProcess(p.pid, p.mark, p.sig, b.cfg.StopTimeout)
		if killed {
			b.say("%s (pid %d) was still running after %s; sent SIGKILL", p.name, p.pid, b.cfg.StopTimeout)
		}
		if err != nil {
			return err
		}
		_ = os.Remove(p.file)
	}
	_ = os.Remove(filepath.Join(b.cfg.Dir, "ports"))
	return nil
}

// legacyStatus reports an old bed's processes; nil when none runs. They
// count as not answering: this bed does not check them, only stops them.
func legacyStatus(dir string) []ServerStatus {
	ports, _ := os.ReadFile(filepath.Join(dir, "ports"))
	recorded := func(name string) string {
		for _, l := range strings.Split(string(ports), "\n") {
			if v, ok := strings.CutPrefix(l, "RECORDED_"+name+"="); ok {
				return "127.0.0.1:" + strings.TrimSpace(v)
			}
		}
		return "its recorded port"
	}
	var s []ServerStatus
	for _, p := range legacyProcs(dir) {
		v := ServerStatus{Name: p.name, PID: p.pid, Err: errLegacy}
		if p.name == "Kafka" {
			v.Service, v.Addr, v.Log = Service{Kind: Kafka}, recorded("KAFKA_PORT"), filepath.Join(dir, "kafka", "logs", "server.log")
		} else {
			v.Service, v.Addr, v.Log = Service{Kind: Postgres}, recorded("PG_PORT"), filepath.Join(filepath.Dir(p.mark[1]), "postgres.log")
		}
		s = append(s, v)
	}
	return s
}

var errLegacy = errors.New("started by the bash scripts/testbed of before; scripts/testbed down stops it")
