package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/cli"
)

// cmdName prefixes the command's messages.
const cmdName = "tidemark lab offsets"

// Offsets runs `tidemark lab offsets` with args (the words after "offsets"),
// reading a script named "-" from stdin, and returns the process's exit
// status: [cli.ExitUsage] for a usage error or a malformed script (with a
// message naming the line on stderr), [cli.ExitFailure] for a script file
// it cannot read or a trace it cannot write.
func Offsets(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(cmdName)
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

Exit status 2 means a usage error or a malformed script (nothing was
replayed); 1 a script file that cannot be read.

`)
		fs.PrintDefaults()
	}
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		return cli.Usagef(stderr, cmdName, "unexpected argument %q", fs.Arg(0))
	}
	strategy, err := ParseStrategy(*strategyName)
	if err != nil {
		return cli.Usagef(stderr, cmdName, "%v", err)
	}
	if *caseName != "" && *script != "" {
		return cli.Usagef(stderr, cmdName, "--case and --script are exclusive")
	}

	var (
		src     io.Reader
		srcName string
		title   string
	)
	switch {
	case *script == "-":
		src, srcName, title = stdin, "stdin", "script from stdin"
	case *script != "":
		f, err := os.Open(*script)
		if err != nil {
			return cli.Failf(stderr, cmdName, "%v", err)
		}
		defer f.Close()
		src, srcName, title = f, *script, "script "+*script
	default:
		c := *caseName
		if c == "" {
			c = "normal"
		}
		text, err := Case(c)
		if err != nil {
			return cli.Usagef(stderr, cmdName, "%v", err)
		}
		src, srcName, title = strings.NewReader(text), "case "+c, "case "+c
	}

	trace, err := Run(src, strategy)
	if err != nil {
		if errors.Is(err, ErrMalformed) {
			// What the user wrote is wrong, as with a bad flag.
			fmt.Fprintf(stderr, "%s: %s: %v\n", cmdName, srcName, err)
			return cli.ExitUsage
		}
		return cli.Failf(stderr, cmdName, "%s: %v", srcName, err)
	}
	if *asJSON {
		err = trace.WriteJSON(stdout)
	} else {
		if _, err = fmt.Fprintf(stdout, "%s: %s, strategy %s\n\n", cmdName, title, strategy); err == nil {
			err = trace.WriteTable(stdout)
		}
	}
	if err != nil {
		return cli.Failf(stderr, cmdName, "%v", err)
	}
	return cli.ExitOK
}
