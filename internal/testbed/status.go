package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Status is what runs of a bed and whether it answers.
type Status struct {
	Servers []ServerStatus
	// Env is the path of the env file when it exists.
	Env string
	// State is the state file's content; nil when no bed is set up.
	State *State
}

// ServerStatus is one server of a bed.
type ServerStatus struct {
	Service Service
	Name    string // "Kafka 4.4.0", "PostgreSQL 15.14"
	PID     int    // 0: not running
	Addr    string // host:port
	Err     error  // why a running server does not answer; nil when it does
	Log     string
	Data    string
	Note    string // anything else worth saying
}

// Serving reports whether the server runs and answers.
func (s ServerStatus) Serving() bool { return s.PID > 0 && s.Err == nil }

// Code is the exit status of `testbed status`: 0 when every server runs
// and answers, 1 when one runs but does not answer, 3 when one does not
// run (and none fails to answer).
func (s Status) Code() int {
	code := 0
	for _, v := range s.Servers {
		switch {
		case v.PID > 0 && v.Err != nil:
			return 1
		case v.PID <= 0:
			code = 3
		}
	}
	return code
}

// Lines is the status in words, one line per server, then the env file's
// export lines.
func (s Status) Lines() []string {
	var lines []string
	for _, v := range s.Servers {
		switch {
		case v.PID <= 0:
			lines = append(lines, v.Name+": not running"+v.Note)
		case v.Err != nil:
			lines = append(lines, fmt.Sprintf("%s: running (pid %d) but NOT answering on %s (%v); log: %s%s", v.Name, v.PID, v.Addr, v.Err, v.Log, v.Note))
		default:
			l := fmt.Sprintf("%s: running (pid %d), serving on %s", v.Name, v.PID, v.Addr)
			if v.Data != "" {
				l += "; data: " + v.Data
			}
			lines = append(lines, l+"; log: "+v.Log+v.Note)
		}
	}
	if s.Env != "" {
		lines = append(lines, "env: "+s.Env)
		b, _ := os.ReadFile(s.Env)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "export ") {
				lines = append(lines, l)
			}
		}
	}
	return lines
}

// Status says what of the bed runs and whether it answers: a Metadata,
// CreateTopics (validate-only) and FindCoordinator round for Kafka, a query
// for PostgreSQL, each bounded by a few seconds and by ctx. It changes
// nothing and takes no lock.
func (b *Bed) Status(ctx context.Context) (Status, error) {
	st, err := loadState(b.cfg.Dir)
	if err != nil {
		return Status{}, err
	}
	s := Status{State: st}
	if _, err := os.Stat(b.EnvFile()); err == nil {
		s.Env = b.EnvFile()
	}
	if st == nil {
		if legacy := legacyStatus(b.cfg.Dir); legacy != nil {
			s.Servers = legacy
			return s, nil
		}
		s.Servers = []ServerStatus{{Service: Service{Kind: Kafka}, Name: "Kafka"}, {Service: Service{Kind: Postgres}, Name: "PostgreSQL"}}
		return s, nil
	}
	if st.Kafka == nil || len(st.Kafka.Nodes) == 0 {
		s.Servers = append(s.Servers, ServerStatus{Service: Service{Kind: Kafka}, Name: "Kafka"})
	} else {
		// The cluster answers as a whole: one check, reported on each node
		// that runs.
		var answer error
		checked := false
		for _, n := range st.Kafka.Nodes {
			v := ServerStatus{Service: Service{Kind: Kafka, Node: n.ID}, Name: b.kafkaName(st, n), Addr: n.Addr(), Log: filepath.Join(n.Logs, "server.log")}
			if ours(n.PID, n.mark()) {
				v.PID = n.PID
				if !checked {
					answer, checked = kafkaAnswers(ctx, st), true
				}
				v.Err = answer
				if n.Paused {
					v.Note = fmt.Sprintf("; PAUSED (SIGSTOP): scripts/testbed resume %s", Service{Kind: Kafka, Node: n.ID})
				}
			}
			s.Servers = append(s.Servers, v)
		}
	}
	if p := st.Postgres; p == nil {
		s.Servers = append(s.Servers, ServerStatus{Service: Service{Kind: Postgres}, Name: "PostgreSQL"})
	} else {
		v := ServerStatus{Service: Service{Kind: Postgres}, Name: "PostgreSQL", Addr: fmt.Sprintf("127.0.0.1:%d", p.Port), Log: p.Log, Data: p.Data}
		if p.Version != "" {
			v.Name += " " + p.Version
		}
		if ours(p.PID, p.mark()) {
			v.PID = p.PID
			_, v.Err = pgQuery(ctx, p.Port, pgDatabase)
		}
		s.Servers = append(s.Servers, v)
	}
	return s, nil
}
