//go:build integration

package integration_test

// The `tidemark inbox` commands against the bed's PostgreSQL: the
// connection string from the environment, never from argv, and the
// leases of a group.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/pkg/inbox"
	"github.com/tidemark/tidemark/pkg/runner"
)

// inboxCommand runs the tidemark binary with args and env (added to an
// environment without any database variable) and returns its output and
// exit status.
func inboxCommand(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(inboxBuildTidemark(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIDEMARK_PG_DSN=") && !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("tidemark %v: %v", args, err)
	return "", 0
}

// TestInboxMigrateWithoutADSNArgument: `tidemark inbox migrate` finds the
// database in TIDEMARK_PG_DSN, or in libpq's PG* variables, so a password
// need not sit in argv.
func TestInboxMigrateWithoutADSNArgument(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(os.Getenv("TIDEMARK_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	a := bed.PG(t).Config().ConnConfig.RuntimeParams["search_path"]
	out, code := inboxCommand(t, []string{"TIDEMARK_PG_DSN=" + os.Getenv("TIDEMARK_PG_DSN")}, "inbox", "migrate", "--schema", a)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("migrated schema %s to version %d", a, inbox.SchemaVersion)) {
		t.Fatalf("migrate with TIDEMARK_PG_DSN: exit %d\n%s", code, out)
	}
	b := bed.PG(t).Config().ConnConfig.RuntimeParams["search_path"]
	env := []string{"PGHOST=" + u.Hostname(), "PGPORT=" + u.Port(), "PGUSER=" + u.User.Username(),
		"PGDATABASE=" + strings.TrimPrefix(u.Path, "/"), "PGSSLMODE=disable"}
	if pw, ok := u.User.Password(); ok {
		env = append(env, "PGPASSWORD="+pw)
	}
	out, code = inboxCommand(t, env, "inbox", "migrate", "--schema", b)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("migrated schema %s to version %d", b, inbox.SchemaVersion)) {
		t.Fatalf("migrate with PG* variables: exit %d\n%s", code, out)
	}
}

// TestInboxLeasesCommand: `tidemark inbox leases` lists a group's leases
// with the member ids they were taken for; --reset alone changes nothing
// and exits 1; --reset --yes bumps them all, and the member that held one
// is fenced.
func TestInboxLeasesCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := inboxDB(t)
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	s := inboxStore(t, pool, "g", inbox.Owner("svc-1"))
	as := []runner.Assignment{
		{TP: runner.TP{Topic: "orders", Partition: 0}, Start: -1, Member: "member-aaa"},
		{TP: runner.TP{Topic: "orders", Partition: 1}, Start: -1, Member: "member-aaa"},
	}
	if _, err := s.AssignHook()(ctx, as); err != nil {
		t.Fatal(err)
	}
	other := inboxStore(t, pool, "other")
	inboxTake(t, other, runner.TP{Topic: "orders", Partition: 0}, -1)
	env := []string{"TIDEMARK_PG_DSN=" + os.Getenv("TIDEMARK_PG_DSN")}

	out, code := inboxCommand(t, env, "inbox", "leases", "--group", "g", "--schema", schema)
	if code != 0 || strings.Count(out, "member-aaa") != 2 || !strings.Contains(out, "svc-1") || strings.Count(out, "\n") != 3 {
		t.Fatalf("leases: exit %d, want the group's two leases\n%s", code, out)
	}
	out, code = inboxCommand(t, env, "inbox", "leases", "--group", "g", "--schema", schema, "--reset")
	if code != 2 || !strings.Contains(out, "would reset the 2 leases") { // a usage error: the confirmation is missing
		t.Fatalf("leases --reset without --yes: exit %d\n%s", code, out)
	}
	if e, _ := s.Epoch(as[0].TP); inboxCount(t, pool, "SELECT max(epoch) FROM tidemark_lease WHERE group_id = 'g'") != e {
		t.Fatal("--reset without --yes changed a lease")
	}
	out, code = inboxCommand(t, env, "inbox", "leases", "--group", "g", "--schema", schema, "--reset", "--yes")
	if code != 0 || !strings.Contains(out, "reset 2 leases of group g") {
		t.Fatalf("leases --reset --yes: exit %d\n%s", code, out)
	}
	if err := s.Handler(inboxEffect("a"))(ctx, inboxRec("orders", 0, 1)); !errors.Is(err, runner.ErrFenced) {
		t.Fatalf("the member after the reset: %v, want ErrFenced", err)
	}
	if n := inboxCount(t, pool, "SELECT epoch FROM tidemark_lease WHERE group_id = 'other'"); n != 1 {
		t.Fatalf("the reset touched another group's lease (epoch %d)", n)
	}
}
