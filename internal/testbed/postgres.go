package testbed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgSystemUser is who runs PostgreSQL when we are root: it refuses to run
// as root, and Debian's package creates this user.
const pgSystemUser = "postgres"

// pgRuns reports whether st's PostgreSQL runs and answers: false when it
// does not run, an error when it runs and does not answer.
func (b *Bed) pgRuns(ctx context.Context, st *State) (bool, error) {
	if st == nil || st.Postgres == nil || !ours(st.Postgres.PID, st.Postgres.mark()) {
		return false, nil
	}
	p := st.Postgres
	if _, err := pgQuery(ctx, p.Port, pgDatabase); err != nil {
		return false, fail(fmt.Sprintf("a PostgreSQL server started earlier (pid %d) runs but does not answer on 127.0.0.1:%d: %v", p.PID, p.Port, err),
			"Read "+p.Log+", or run: scripts/testbed down && scripts/testbed up")
	}
	b.say("PostgreSQL already running (pid %d) on 127.0.0.1:%d", p.PID, p.Port)
	return true, nil
}

// planPG checks what a PostgreSQL start needs and returns the server to
// start.
func (b *Bed) planPG(p ports) (*PostgresState, runAs, error) {
	bin, err := findPGBin(b.cfg.PGBin)
	if err != nil {
		return nil, runAs{}, err
	}
	as, err := pgRunAs()
	if err != nil {
		return nil, runAs{}, err
	}
	if err := portFree(p.pg); err != nil {
		return nil, runAs{}, fail(err.Error()+", so PostgreSQL cannot listen there.",
			"Stop that process, or pick another port: TIDEMARK_PG_PORT=<port> scripts/testbed up")
	}
	if err := os.MkdirAll(pgDir(b.cfg.Dir), 0o755); err != nil {
		return nil, runAs{}, err
	}
	data := pgDataDir(b.cfg.Dir, as.reaches)
	return &PostgresState{Bin: bin, Port: p.pg, Data: data, Log: filepath.Join(filepath.Dir(data), "postgres.log"), RunAs: as.name}, as, nil
}

// launchPG makes a fresh cluster in the throwaway data directory, starts
// the postmaster (recording its pid), creates the database and waits until
// it answers a query.
func (b *Bed) launchPG(ctx context.Context, st *State, as runAs) error {
	t0 := time.Now()
	p := st.Postgres
	base := filepath.Dir(p.Data)
	if err := os.RemoveAll(p.Data); err != nil {
		return err
	}
	if err := os.Remove(p.Log); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	if as.cred != nil {
		if err := os.Chown(base, as.uid, as.gid); err != nil {
			return err
		}
	}
	ictx, cancel := context.WithTimeout(ctx, b.cfg.PGStartTimeout)
	defer cancel()
	initLog := filepath.Join(base, "initdb.log")
	if err := runLogged(ictx, initdbArgv(p.Bin, p.Data), initLog, as.cred); err != nil {
		return fail("initdb failed: "+err.Error(), "Read "+initLog, tail(initLog, 20))
	}
	// Files initdb made (owned by PostgreSQL's user); writing them keeps
	// their owner.
	if err := os.WriteFile(filepath.Join(p.Data, "pg_hba.conf"), []byte(pgHBA), 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(p.Data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(pgConf(p.Port))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if p.PID, err = startDetached(postgresArgv(p), base, p.Log, as.cred); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	if err := saveState(b.cfg.Dir, st); err != nil {
		return err
	}
	timeout := b.cfg.PGStartTimeout - time.Since(t0)
	if _, err := waitPG(ctx, p, "postgres", timeout); err != nil {
		return err
	}
	if err := createDatabase(ctx, p.Port); err != nil {
		return fail("creating database "+pgDatabase+" failed: "+err.Error(), "Read "+p.Log, tail(p.Log, 20))
	}
	if p.Version, err = waitPG(ctx, p, pgDatabase, b.cfg.PGStartTimeout-time.Since(t0)); err != nil {
		return err
	}
	if err := saveState(b.cfg.Dir, st); err != nil {
		return err
	}
	b.say("PostgreSQL %s up (pid %d) on 127.0.0.1:%d in %d ms; log: %s", p.Version, p.PID, p.Port, time.Since(t0).Milliseconds(), p.Log)
	return nil
}

// stopPG stops p's postmaster and clears its pid: SIGINT (fast shutdown)
// or, under Crash, SIGQUIT (immediate shutdown), then SIGKILL after the
// stop timeout. The postmaster's children lead process groups of their
// own, so that SIGKILL reaches only the postmaster; they exit when they
// see it gone.
func (b *Bed) stopPG(p *PostgresState, m Mode) error {
	if !ours(p.PID, p.mark()) {
		b.notRunning("PostgreSQL", p.PID)
		p.PID = 0
		return nil
	}
	sig := syscall.SIGINT
	if m == Crash {
		sig = syscall.SIGQUIT
		b.say("stopping PostgreSQL immediately (pid %d, SIGQUIT)", p.PID)
	} else {
		b.say("stopping PostgreSQL (pid %d)", p.PID)
	}
	killed, err := stopProcess(p.PID, p.mark(), sig, b.cfg.StopTimeout)
	if killed {
		b.say("PostgreSQL (pid %d) was still running after %s; sent SIGKILL", p.PID, b.cfg.StopTimeout)
	}
	if err != nil {
		return fmt.Errorf("stop PostgreSQL: %w", err)
	}
	p.PID = 0
	return nil
}

// startPG starts p's postmaster again on its data directory, unless it
// runs, and waits until it answers a query.
func (b *Bed) startPG(ctx context.Context, st *State) error {
	t0 := time.Now()
	p := st.Postgres
	if ours(p.PID, p.mark()) {
		if _, err := pgQuery(ctx, p.Port, pgDatabase); err != nil {
			return fail(fmt.Sprintf("PostgreSQL (pid %d) runs but does not answer on 127.0.0.1:%d: %v", p.PID, p.Port, err),
				"Read "+p.Log+", or run: scripts/testbed restart postgres")
		}
		b.say("PostgreSQL already running (pid %d) on 127.0.0.1:%d", p.PID, p.Port)
		return nil
	}
	p.PID = 0
	if _, err := os.Stat(filepath.Join(p.Data, "PG_VERSION")); err != nil {
		return fail(p.Data + " is not a PostgreSQL data directory: run scripts/testbed up first.")
	}
	var cred *syscall.Credential
	if p.RunAs != "" {
		as, err := lookupRunAs(p.RunAs)
		if err != nil {
			return err
		}
		cred = as.cred
	}
	if err := waitPortsFree(5*time.Second, p.Port); err != nil {
		return fail(err.Error()+", so PostgreSQL cannot listen there.", "Stop that process.")
	}
	pid, err := startDetached(postgresArgv(p), filepath.Dir(p.Data), p.Log, cred)
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	p.PID = pid
	if err := saveState(b.cfg.Dir, st); err != nil {
		return err
	}
	if _, err := waitPG(ctx, p, pgDatabase, b.cfg.PGStartTimeout); err != nil {
		return err
	}
	b.say("PostgreSQL started again (pid %d) on 127.0.0.1:%d in %d ms; log: %s", p.PID, p.Port, time.Since(t0).Milliseconds(), p.Log)
	return nil
}

// findPGBin returns PostgreSQL's bin directory: bin when set, else the
// newest /usr/lib/postgresql/*/bin (Debian's layout), else the directory of
// initdb on PATH. It must hold initdb and postgres.
func findPGBin(bin string) (string, error) {
	has := func(d string) bool {
		return isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres"))
	}
	if bin != "" {
		if !has(bin) {
			return "", fail(fmt.Sprintf("TIDEMARK_PG_BIN=%s has no initdb and postgres.", bin),
				"Point it at PostgreSQL's bin directory, or unset it.")
		}
		return bin, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", fail("PostgreSQL's initdb and postgres not found (looked in /usr/lib/postgresql/*/bin and PATH).",
		"Install it (Debian: apt-get install -y postgresql; scripts/testbed up does as root) or set TIDEMARK_PG_BIN to its bin directory.")
}

// runAs is the system user PostgreSQL runs as: nobody (ourselves) unless we
// are root, then pgSystemUser.
type runAs struct {
	name     string
	cred     *syscall.Credential
	uid, gid int
}

func pgRunAs() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	return lookupRunAs(pgSystemUser)
}

// lookupRunAs returns the credentials of the system user name, with its
// supplementary groups, as runuser gives them.
func lookupRunAs(name string) (runAs, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return runAs{}, fail("running as root, but there is no '"+name+"' user to run PostgreSQL as (it refuses to run as root).",
			"Install Debian's postgresql package (it creates the user), or run scripts/testbed as a normal user.")
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return runAs{}, fmt.Errorf("user %s has uid %q and gid %q: not numbers", name, u.Uid, u.Gid)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.Atoi(g); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return runAs{name: u.Username, cred: cred, uid: uid, gid: gid}, nil
}

// reaches reports whether r can enter dir (the kernel decides: test -x
// runs as r).
func (r runAs) reaches(dir string) bool {
	if r.cred == nil {
		return true
	}
	cmd := exec.Command("test", "-x", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	return cmd.Run() == nil
}

// pgQuery connects to db on port and checks that a real query answers;
// bounded by 2 s per step. It returns server_version's first word.
func pgQuery(ctx context.Context, port int, db string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(pgDSN(port, db))
	if err != nil {
		return "", err
	}
	cfg.ConnectTimeout = 2 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if err := conn.Ping(ctx); err != nil {
		return "", err
	}
	var n int
	var v string
	if err := conn.QueryRow(ctx, "SELECT 40 + 2, current_setting('server_version')").Scan(&n, &v); err != nil {
		return "", err
	}
	if n != 42 {
		return "", fmt.Errorf("SELECT 40 + 2 returned %d", n)
	}
	return strings.Fields(v + " ")[0], nil
}

// createDatabase creates the bed's database on a fresh server.
func createDatabase(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgDSN(port, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{pgDatabase}.Sanitize())
	return err
}

// waitPG waits until the server of p answers a query on db while its
// postmaster runs, within timeout, and returns its version.
func waitPG(ctx context.Context, p *PostgresState, db string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if exited(p.PID) {
			return "", fail("PostgreSQL exited while starting.", "Read "+p.Log, tail(p.Log, 20))
		}
		v, err := pgQuery(ctx, p.Port, db)
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if time.Now().After(deadline) {
			return "", fail(fmt.Sprintf("PostgreSQL (pid %d) does not answer queries on 127.0.0.1:%d within %s: %v", p.PID, p.Port, timeout, err),
				"Read "+p.Log+"; raise TIDEMARK_PG_START_TIMEOUT on a slow machine.", tail(p.Log, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
