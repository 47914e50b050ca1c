// Package cli holds what every `tidemark` command shares: its exit
// statuses and how it parses flags and reports a usage error.
//
// The statuses are the same for every command: 0 when it did what was
// asked (help included), 2 for a usage error — an unknown command or
// flag, a missing or malformed argument or setting, a malformed lab
// script — found before anything was done, 1 when the command ran and
// failed (a file it cannot read, a database or broker that fails).
// Help goes to stdout; errors, and the usage that follows them, to stderr.
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// Exit statuses of every command.
const (
	// ExitOK means the command did what was asked, or printed its help.
	ExitOK = 0
	// ExitFailure means the command ran and failed; stderr says why.
	ExitFailure = 1
	// ExitUsage means the command line (or a setting it reads from the
	// environment) was wrong and nothing was done; stderr says what.
	ExitUsage = 2
)

// NewFlagSet returns a flag set for the command name ("tidemark inbox
// migrate") that reports errors instead of exiting; its Usage must write to
// its Output, as flag.PrintDefaults does.
func NewFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet(name, flag.ContinueOnError)
}

// Parse parses args with fs. On -h, -help or --help it writes fs's usage to
// stdout and returns (ExitOK, true); on a bad flag it writes the flag
// package's message and the usage to stderr and returns (ExitUsage, true);
// otherwise (0, false) and the command goes on. Afterwards fs's output is
// stderr.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, done bool) {
	// flag prints the usage before Parse returns and cannot tell us
	// first whether it is for -h (stdout) or for an error (stderr).
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		stdout.Write(buf.Bytes())
		return ExitOK, true
	case err != nil:
		stderr.Write(buf.Bytes())
		return ExitUsage, true
	}
	return 0, false
}

// Usagef writes "NAME: message" and where to find the command's usage to
// stderr, and returns ExitUsage.
func Usagef(stderr io.Writer, name, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s\nRun \"%s -h\" for its usage.\n", name, fmt.Sprintf(format, a...), name)
	return ExitUsage
}

// Failf writes "NAME: message" to stderr and returns ExitFailure.
func Failf(stderr io.Writer, name, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, fmt.Sprintf(format, a...))
	return ExitFailure
}

// Brokers parses a comma-separated list of Kafka brokers, each host:port
// with a port of 1 to 65535; from names where the list came from (a flag
// or a variable) in the error. An empty entry is refused, not dropped: the
// client would dial its default localhost:9092 for it, and a broker there
// would be used silently.
func Brokers(list, from string) ([]string, error) {
	parts := strings.Split(list, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%s: broker %d of %d is empty", from, i+1, len(parts))
		}
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not host:port", from, p)
		}
		if host == "" {
			return nil, fmt.Errorf("%s: %q has no host", from, p)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s: %q has no port number (1-65535)", from, p)
		}
		out = append(out, p)
	}
	return out, nil
}
