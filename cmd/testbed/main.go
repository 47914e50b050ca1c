// Command testbed runs tidemark's test bed: a real Kafka broker and a real
// PostgreSQL server on 127.0.0.1 (internal/testbed; docs/testbed.md).
// scripts/testbed provisions what it needs (packages, the broker's jars),
// builds this command and runs it; use that script.
//
// Usage:
//
//	testbed [-root DIR] up
//	testbed [-root DIR] down
//	testbed [-root DIR] status
//	testbed [-root DIR] stop|restart kafka|kafka-N|postgres [--kill]
//	testbed [-root DIR] start kafka|kafka-N|postgres
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
	"strings"
	"syscall"

	"github.com/tidemark/tidemark/internal/testbed"
)

const usage = `usage: testbed [-root DIR] up|down|status
       testbed [-root DIR] stop|restart kafka|kafka-N|postgres [--kill]
       testbed [-root DIR] start kafka|kafka-N|postgres
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

	a := fs.Args()
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
