package lab

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit statuses of [Offsets].
const (
	// ExitOK means the trace was printed.
	ExitOK = 0
	// ExitError means a usage error or an unreadable script.
	ExitError = 1
	// ExitMalformed means a malformed script, and only that.
	ExitMalformed = 2
)

// Offsets runs `tidemark lab offsets` with args (the words after "offsets"),
// reading a script named "-" from stdin, and returns the process's exit
// status: [ExitMalformed] for a malformed script (with a message naming the
// line on stderr), [ExitError] for anything else that went wrong.
func Offsets(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tidemark lab offsets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	caseName := fs.String("case", "", "a built-in trace: "+strings.Join(Cases(), ", ")+" (default normal)")
	script := fs.String("script", "", "a script `file` to replay, or - for stdin")
	strategyName := fs.String("strategy", "prefix", "prefix, or naive to check the max(completed)+1 rule beside it")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: tidemark lab offsets [--case normal|stale|handoff | --script FILE] [--strategy prefix|naive] [--json]

Replays a trace of one partition (assignments, deliveries, completions,
positions, revokes, losses) and prints the safe offset to commit after each
step. Script: one operation per line, '#' starts a comment:

  assign EPOCH START     deliver OFF [OFF...]   complete OFF [EPOCH]
  position POS           revoke                 lost

Exit status 2 means a malformed script; 1 any other error.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tidemark lab offsets: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return ExitError
	}
	strategy, err := ParseStrategy(*strategyName)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark lab offsets: %v\n", err)
		return ExitError
	}
	if *caseName != "" && *script != "" {
		fmt.Fprintln(stderr, "tidemark lab offsets: --case and --script are exclusive")
		return ExitError
	}

	var (
		src   io.Reader
		name  string
		title string
	)
	switch {
	case *script == "-":
		src, name, title = stdin, "stdin", "script from stdin"
	case *script != "":
		f, err := os.Open(*script)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark lab offsets: %v\n", err)
			return ExitError
		}
		defer f.Close()
		src, name, title = f, *script, "script "+*script
	default:
		c := *caseName
		if c == "" {
			c = "normal"
		}
		text, err := Case(c)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark lab offsets: %v\n", err)
			return ExitError
		}
		src, name, title = strings.NewReader(text), "case "+c, "case "+c
	}

	trace, err := Run(src, strategy)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark lab offsets: %s: %v\n", name, err)
		if errors.Is(err, ErrMalformed) {
			return ExitMalformed
		}
		return ExitError
	}
	if *asJSON {
		err = trace.WriteJSON(stdout)
	} else {
		if _, err = fmt.Fprintf(stdout, "tidemark lab offsets: %s, strategy %s\n\n", title, strategy); err == nil {
			err = trace.WriteTable(stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "tidemark lab offsets: %v\n", err)
		return ExitError
	}
	return ExitOK
}
