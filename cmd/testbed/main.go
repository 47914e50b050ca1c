// Command testbed runs tidemark's test bed: a real Kafka broker and a real
// PostgreSQL server on 127.0.0.1 (internal/testbed; docs/testbed.md).
// scripts/testbed provisions what it needs (packages, the broker's jars),
// builds this command and runs it; use that script.
//
// Usage:
//
//	testbed [-root DIR] up [--cluster N]
//	testbed [-root DIR] down
//	testbed [-root DIR] status
//	testbed [-root DIR] stop|restart kafka|kafka-N|postgres [--kill]
//	testbed [-root DIR] start kafka|kafka-N|postgres
//	testbed [-root DIR] kill kafka|kafka-N|postgres    (stop --kill)
//	testbed [-root DIR] pause|resume kafka|kafka-N     (SIGSTOP, SIGCONT)
//	testbed [-root DIR] leader TOPIC PARTITION         (prints the node id)
//	testbed [-root DIR] coordinator GROUP              (prints the node id)
//	testbed [-root DIR] insync [SECONDS]               (waits for every ISR)
//
// The settings are the TIDEMARK_* variables of docs/testbed.md. The exit
// status is 0 on success, 1 on failure and 2 on bad usage; status exits 1
// when a server runs but does not answer and 3 when one does not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/internal/testbed"
)

const usage = `usage: testbed [-root DIR] up [--cluster N] | down | status
       testbed [-root DIR] stop|restart kafka|kafka-N|postgres [--kill]
       testbed [-root DIR] start|kill kafka|kafka-N|postgres
       testbed [-root DIR] pause|resume kafka|kafka-N
       testbed [-root DIR] leader TOPIC PARTITION | coordinator GROUP | insync [SECONDS]
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("testbed", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	root := fs.String("root", "", "the checkout (default: the nearest directory above the working directory with scripts/testbed)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *root == "" {
		wd, err := os.Getwd()
		if err == nil {
			wd, err = testbed.FindRoot(wd)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
			return 2
		}
		*root = wd
	}
	cfg, err := testbed.FromEnv(*root, os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
		return 1
	}
	a := fs.Args()
	if len(a) >= 1 && a[0] == "up" && len(a) == 3 && a[1] == "--cluster" {
		n, err := strconv.Atoi(a[2])
		if err != nil || n < 1 || n > testbed.MaxKafkaNodes {
			fmt.Fprintf(os.Stderr, "testbed: up --cluster %q: want a number of Kafka nodes (1-%d)\n%s", a[2], testbed.MaxKafkaNodes, usage)
			return 2
		}
		cfg.KafkaNodes = n
		a = a[:1]
	}
	cfg.Out = os.Stdout
	bed, err := testbed.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
		return 1
	}
	// Ctrl-C or SIGTERM ends the waits; a failing up then stops what it
	// started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if len(a) == 0 {
		fs.Usage()
		return 2
	}
	switch verb := a[0]; verb {
	case "up", "down", "status":
		if len(a) != 1 {
			fs.Usage()
			return 2
		}
		switch verb {
		case "up":
			err = bed.Up(ctx)
		case "down":
			err = bed.Down(ctx)
		case "status":
			s, serr := bed.Status(ctx)
			if serr != nil {
				err = serr
				break
			}
			for _, l := range s.Lines() {
				if strings.HasPrefix(l, "export ") {
					fmt.Println(l)
				} else {
					fmt.Println("testbed: " + l)
				}
			}
			return s.Code()
		}
	case "kill":
		if len(a) != 2 {
			fs.Usage()
			return 2
		}
		svc, uerr := testbed.ParseService(a[1])
		if uerr != nil {
			fmt.Fprintf(os.Stderr, "testbed: %v\n%s", uerr, usage)
			return 2
		}
		err = bed.Stop(ctx, svc, testbed.Crash)
	case "pause", "resume":
		if len(a) != 2 {
			fs.Usage()
			return 2
		}
		svc, uerr := testbed.ParseService(a[1])
		if uerr != nil || svc.Kind != testbed.Kafka {
			fmt.Fprintf(os.Stderr, "testbed: %s takes kafka or kafka-N\n%s", verb, usage)
			return 2
		}
		if verb == "pause" {
			err = bed.Pause(ctx, svc)
		} else {
			err = bed.Resume(ctx, svc)
		}
	case "leader", "coordinator", "insync":
		return query(ctx, bed, a)
	case "stop", "start", "restart":
		svc, mode, uerr := parseOne(verb, a[1:])
		if uerr != nil {
			fmt.Fprintf(os.Stderr, "testbed: %v\n%s", uerr, usage)
			return 2
		}
		switch verb {
		case "stop":
			err = bed.Stop(ctx, svc, mode)
		case "start":
			err = bed.Start(ctx, svc)
		case "restart":
			err = bed.Restart(ctx, svc, mode)
		}
	default:
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
		return 1
	}
	return 0
}

// query runs leader, coordinator and insync, which print an answer or
// wait, and change nothing.
func query(ctx context.Context, bed *testbed.Bed, a []string) int {
	var id int32
	var err error
	switch {
	case a[0] == "leader" && len(a) == 3:
		p, perr := strconv.ParseInt(a[2], 10, 32)
		if perr != nil || p < 0 {
			fmt.Fprintf(os.Stderr, "testbed: leader %s %q: want a partition number\n%s", a[1], a[2], usage)
			return 2
		}
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		id, err = bed.Leader(qctx, a[1], int32(p))
	case a[0] == "coordinator" && len(a) == 2:
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		id, err = bed.Coordinator(qctx, a[1])
	case a[0] == "insync" && len(a) <= 2:
		within := 2 * time.Minute
		if len(a) == 2 {
			s, perr := strconv.Atoi(a[1])
			if perr != nil || s < 1 {
				fmt.Fprintf(os.Stderr, "testbed: insync %q: want seconds\n%s", a[1], usage)
				return 2
			}
			within = time.Duration(s) * time.Second
		}
		if err := bed.WaitInSync(ctx, within); err != nil {
			fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
			return 1
		}
		fmt.Println("testbed: every partition has all its replicas in sync")
		return 0
	default:
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed: error: %v\n", err)
		return 1
	}
	fmt.Println(id)
	return 0
}

// parseOne parses the arguments of stop, start and restart.
func parseOne(verb string, a []string) (testbed.Service, testbed.Mode, error) {
	if len(a) == 0 || len(a) > 2 {
		return testbed.Service{}, 0, fmt.Errorf("%s takes a service and, except start, an optional --kill", verb)
	}
	svc, err := testbed.ParseService(a[0])
	if err != nil {
		return svc, 0, err
	}
	mode := testbed.Graceful
	if len(a) == 2 {
		if a[1] != "--kill" || verb == "start" {
			return svc, 0, fmt.Errorf("%s %s: unexpected %q", verb, a[0], a[1])
		}
		mode = testbed.Crash
	}
	return svc, mode, nil
}
