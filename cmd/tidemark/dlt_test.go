package main_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDLTReplayArguments: the command's usage errors, without a broker
// (tests against the real one are in integration/dlt_replay_test.go).
func TestDLTReplayArguments(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"help", []string{"dlt", "replay", "-h"}, 0, "usage: tidemark dlt replay --from TOPIC.dlt --to TOPIC", ""},
		{"--help", []string{"dlt", "replay", "--help"}, 0, "usage: tidemark dlt replay --from TOPIC.dlt --to TOPIC", ""},
		{"unknown flag", []string{"dlt", "replay", "--form", "x"}, 2, "", "flag provided but not defined: -form\nusage: tidemark dlt replay"},
		{"listed in help", []string{"help"}, 0, "dlt replay", ""},
		{"no from", []string{"dlt", "replay", "--to", "orders"}, 2, "", "--from is required"},
		{"no to", []string{"dlt", "replay", "--from", "orders.dlt"}, 2, "", "--to is required"},
		{"same topic", []string{"dlt", "replay", "--from", "x", "--to", "x"}, 2, "", `--from and --to are both "x"`},
		{"no brokers", []string{"dlt", "replay", "--from", "orders.dlt", "--to", "orders"}, 2, "", "no brokers: pass --brokers or set TIDEMARK_KAFKA_BROKERS"},
		{"bad offsets", []string{"dlt", "replay", "--from", "a", "--to", "b", "--offsets", "9-3"}, 2, "", `--offsets "9-3" is not FROM-TO`},
		{"bad header", []string{"dlt", "replay", "--from", "a", "--to", "b", "--header", "=v"}, 2, "", `--header "=v" has no header name`},
		{"bad partition", []string{"dlt", "replay", "--from", "a", "--to", "b", "--partition", "-2"}, 2, "", "--partition -2 is not a partition number"},
		{"bad timeout", []string{"dlt", "replay", "--from", "a", "--to", "b", "--timeout", "0s"}, 2, "", "--timeout 0s is not positive"},
		{"extra argument", []string{"dlt", "replay", "--from", "a", "--to", "b", "now"}, 2, "", `unexpected argument "now"`},
		{"dlt alone", []string{"dlt"}, 2, "", "tidemark dlt: missing sub-command\n\nusage: tidemark dlt <sub-command>"},
		{"dlt help", []string{"dlt", "-h"}, 0, "  replay ", ""},
		{"dlt unknown", []string{"dlt", "redrive"}, 2, "", `tidemark dlt: unknown sub-command "redrive"`},
		{"broker not a port", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", "127.0.0.1:notaport"}, 2, "", `--brokers: "127.0.0.1:notaport" has no port number (1-65535)`},
		{"broker port 0", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", "127.0.0.1:0"}, 2, "", `--brokers: "127.0.0.1:0" has no port number (1-65535)`},
		{"broker without port", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", "kafka"}, 2, "", `--brokers: "kafka" is not host:port`},
		{"brokers only a comma", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", ","}, 2, "", "--brokers: broker 1 of 2 is empty"},
		{"brokers with an empty one", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", "a:1,,b:2"}, 2, "", "--brokers: broker 2 of 3 is empty"},
		{"broker without host", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", ":9092"}, 2, "", `--brokers: ":9092" has no host`},
		{"bad brokers from the environment", []string{"dlt", "replay", "--from", "a", "--to", "b"}, 2, "", `TIDEMARK_KAFKA_BROKERS: "[::1]" is not host:port`},
		{"unreachable broker", []string{"dlt", "replay", "--from", "a", "--to", "b", "--brokers", "127.0.0.1:1", "--timeout", "2s"}, 1, "", "tidemark dlt replay: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "TIDEMARK_KAFKA_BROKERS=") {
					env = append(env, kv)
				}
			}
			if tt.name == "bad brokers from the environment" {
				env = append(env, "TIDEMARK_KAFKA_BROKERS=[::1]")
			}
			cmd.Env = env
			runExpect(t, cmd, tt.code, tt.stdout, tt.stderr)
		})
	}
}
