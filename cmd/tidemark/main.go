package main

import (
	"fmt"
	"io"
	"os"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/dltcmd"
	"github.com/tidemark/tidemark/cmd/tidemark/internal/inboxcmd"
	"github.com/tidemark/tidemark/cmd/tidemark/internal/lab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: tidemark <command> [arguments]

commands:
  lab offsets     replay a watermark trace: which offset is safe to commit
  inbox migrate   create or upgrade the inbox's PostgreSQL tables
  inbox leases    list a group's partition leases; reset them (--reset --yes)
  dlt replay      republish dead letters to their topic (redrive)

Run "tidemark <command> -h" (for example "tidemark inbox leases -h") for its flags.
`

// run dispatches to a command and returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch {
	case len(args) >= 2 && args[0] == "lab" && args[1] == "offsets":
		return lab.Offsets(args[2:], stdin, stdout, stderr)
	case len(args) >= 2 && args[0] == "inbox" && args[1] == "migrate":
		return inboxcmd.Migrate(args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "inbox" && args[1] == "leases":
		return inboxcmd.Leases(args[2:], stdout, stderr)
	case len(args) >= 2 && args[0] == "dlt" && args[1] == "replay":
		return dltcmd.Replay(args[2:], stdout, stderr)
	case len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help"):
		fmt.Fprint(stdout, usage)
		return lab.ExitOK
	}
	fmt.Fprint(stderr, usage)
	return lab.ExitError
}
