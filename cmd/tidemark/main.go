package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/cli"
	"github.com/tidemark/tidemark/cmd/tidemark/internal/dltcmd"
	"github.com/tidemark/tidemark/cmd/tidemark/internal/inboxcmd"
	"github.com/tidemark/tidemark/cmd/tidemark/internal/lab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: tidemark <command> [arguments]

commands:
  lab offsets     replay a watermark lab script: which offset is safe to commit
  inbox migrate   create or upgrade the inbox's PostgreSQL tables
  inbox leases    list a group's partition leases; reset them (--reset --yes)
  dlt replay      republish dead letters to their topic (redrive)
  version         print tidemark's version
  help [command]  print this, or a command's usage

Run "tidemark <command> -h" (for example "tidemark inbox leases -h") for its flags.
Exit status: 0 done, 1 the command ran and failed, 2 a usage error (nothing was done).
`

// command is a sub-command: "offsets" of "lab".
type command struct {
	name, summary string
	run           func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

// groups are the commands that take a sub-command, in the order of usage.
var groups = []struct {
	name string
	subs []command
}{
	{"lab", []command{
		{"offsets", "replay a watermark lab script: which offset is safe to commit", lab.Offsets},
	}},
	{"inbox", []command{
		{"migrate", "create or upgrade the inbox's PostgreSQL tables", noStdin(inboxcmd.Migrate)},
		{"leases", "list a group's partition leases; reset them (--reset --yes)", noStdin(inboxcmd.Leases)},
	}},
	{"dlt", []command{
		{"replay", "republish dead letters to their topic (redrive)", noStdin(dltcmd.Replay)},
	}},
}

func noStdin(f func(args []string, stdout, stderr io.Writer) int) func([]string, io.Reader, io.Writer, io.Writer) int {
	return func(args []string, _ io.Reader, stdout, stderr io.Writer) int { return f(args, stdout, stderr) }
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// run dispatches to a command and returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "tidemark: missing command\n\n"+usage)
		return cli.ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	case "help":
		return help(args[1:], stdin, stdout, stderr)
	case "version", "-version", "--version":
		return version(args[1:], stdout, stderr)
	}
	for _, g := range groups {
		if g.name != args[0] {
			continue
		}
		gusage := groupUsage(g.name, g.subs)
		switch {
		case len(args) == 1:
			fmt.Fprintf(stderr, "tidemark %s: missing sub-command\n\n%s", g.name, gusage)
			return cli.ExitUsage
		case isHelp(args[1]):
			fmt.Fprint(stdout, gusage)
			return cli.ExitOK
		}
		for _, c := range g.subs {
			if c.name == args[1] {
				return c.run(args[2:], stdin, stdout, stderr)
			}
		}
		fmt.Fprintf(stderr, "tidemark %s: unknown sub-command %q\n\n%s", g.name, args[1], gusage)
		return cli.ExitUsage
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "tidemark: unknown flag %q (flags come after the command)\n\n%s", args[0], usage)
	} else {
		fmt.Fprintf(stderr, "tidemark: unknown command %q\n\n%s", args[0], usage)
	}
	return cli.ExitUsage
}

// groupUsage lists the sub-commands of the command name.
func groupUsage(name string, subs []command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: tidemark %s <sub-command> [arguments]\n\nsub-commands:\n", name)
	for _, c := range subs {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "\nRun \"tidemark %s <sub-command> -h\" for its flags.\n", name)
	return b.String()
}

// help is `tidemark help [command [sub-command]]`: the usage of the
// command named, on stdout.
func help(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0, len(args) == 1 && isHelp(args[0]):
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	case len(args) == 1:
		if args[0] == "version" || args[0] == "help" {
			return run([]string{args[0], "-h"}, stdin, stdout, stderr)
		}
		for _, g := range groups {
			if g.name == args[0] {
				return run([]string{args[0], "-h"}, stdin, stdout, stderr)
			}
		}
	case len(args) == 2:
		for _, g := range groups {
			if g.name == args[0] && slices.ContainsFunc(g.subs, func(c command) bool { return c.name == args[1] }) {
				return run([]string{args[0], args[1], "-h"}, stdin, stdout, stderr)
			}
		}
	}
	fmt.Fprintf(stderr, "tidemark help: unknown command %q\n\n%s", strings.Join(args, " "), usage)
	return cli.ExitUsage
}

const versionUsage = `usage: tidemark version

Prints the module version tidemark was built from and, when the build
recorded it, the VCS revision, its time, and "modified" for a build from a
checkout with uncommitted changes. "go install ...@v1.2.3" gives v1.2.3; a
"go build" in a git checkout gives a pseudo-version (v0.0.0-DATE-REVISION,
+dirty when modified) and the revision; "go run" records no VCS
information and gives "(devel)".
`

// version is `tidemark version`.
func version(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Fprint(stdout, versionUsage)
			return cli.ExitOK
		}
		return cli.Usagef(stderr, "tidemark version", "unexpected argument %q", args[0])
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return cli.Failf(stderr, "tidemark version", "the binary holds no build information")
	}
	fmt.Fprintln(stdout, versionLine(info))
	return cli.ExitOK
}

// versionLine is "tidemark VERSION" with the VCS revision, its time and
// "modified" when the build recorded them, and the Go version.
func versionLine(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	line := "tidemark " + v
	if rev != "" {
		line += " (revision " + rev
		if at != "" {
			line += ", " + at
		}
		if modified {
			line += ", modified"
		}
		line += ")"
	}
	return line + " " + info.GoVersion
}
