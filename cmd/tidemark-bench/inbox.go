package main

// The inbox workload's own parts: a PostgreSQL server of the bench's own
// that keeps its promises (fsync and synchronous_commit on, its data
// directory on disk), what pg_test_fsync says of that disk, and a pool
// whose round trips internal/pgtrace counts, for what each inbox mode
// costs per record.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/internal/pgtrace"
	"github.com/tidemark/tidemark/pkg/runner"
)

// Server is a PostgreSQL server the inbox workload ran on.
type Server struct {
	Name string `json:"name"` // bed, durable
	// Settings are the server's fsync, synchronous_commit and
	// full_page_writes, as it reported them.
	Settings map[string]string `json:"settings"`
	// DataDir is where a server the bench started kept its data, and
	// FsyncTest what pg_test_fsync said of that disk.
	DataDir   string `json:"data_dir,omitempty"`
	FsyncTest string `json:"pg_test_fsync,omitempty"`
}

// durablePG is the PostgreSQL server the bench starts for the inbox
// workload's durable run.
type durablePG struct {
	bin, dir string
	asPG     bool // run its programs as the postgres user (we are root)
	dsn      string
}

// tmpfs and ramfs: a data directory there is not on disk.
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// pgBin finds PostgreSQL's programs: $TIDEMARK_PG_BIN, the newest
// /usr/lib/postgresql/*/bin, or initdb's directory on PATH.
func pgBin() (string, error) {
	if d := os.Getenv("TIDEMARK_PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL's initdb not found (TIDEMARK_PG_BIN, /usr/lib/postgresql/*/bin, PATH); install PostgreSQL or pass -durable=false")
}

// startDurablePG initialises and starts a server in a fresh directory
// under parent, which must be on disk, and runs pg_test_fsync there.
func startDurablePG(ctx context.Context, parent string) (*durablePG, *Server, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, nil, err
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(parent, &fs); err != nil {
		return nil, nil, err
	}
	if fs.Type == tmpfsMagic || fs.Type == ramfsMagic {
		return nil, nil, fmt.Errorf("-durable-dir %s is on a memory file system; the durable server's data must be on disk", parent)
	}
	dir, err := os.MkdirTemp(parent, "durable-pg-")
	if err != nil {
		return nil, nil, err
	}
	d := &durablePG{bin: bin, dir: dir, asPG: os.Geteuid() == 0}
	if d.asPG {
		// PostgreSQL refuses to run as root: its programs run as the
		// postgres user, who must own the directory and reach it.
		u, err := user.Lookup("postgres")
		if err != nil {
			d.remove()
			return nil, nil, errors.New("running as root, and there is no postgres user to run the durable PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			d.remove()
			return nil, nil, err
		}
		if out, err := d.run(ctx, "test", "-w", dir); err != nil {
			d.remove()
			return nil, nil, fmt.Errorf("the postgres user cannot write %s (pass a -durable-dir it can reach): %v %s", dir, err, out)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := d.run(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "tidemark", "--auth=trust", "-E", "UTF8", "--no-locale"); err != nil {
		d.remove()
		return nil, nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		d.remove()
		return nil, nil, err
	}
	conf := fmt.Sprintf(`
# tidemark-bench: a server that keeps its promises
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = ''
max_connections = 100
fsync = on
synchronous_commit = on
full_page_writes = on
`, port)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		d.remove()
		return nil, nil, err
	}
	if out, err := d.run(ctx, filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "postgres.log"), "-w", "-t", "60", "start"); err != nil {
		d.remove()
		return nil, nil, fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	admin := fmt.Sprintf("postgres://tidemark@127.0.0.1:%d/postgres?sslmode=disable", port)
	conn, err := pgx.Connect(ctx, admin)
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE tidemark")
		conn.Close(ctx)
	}
	if err != nil {
		d.stop()
		return nil, nil, fmt.Errorf("the durable PostgreSQL: %w", err)
	}
	d.dsn = fmt.Sprintf("postgres://tidemark@127.0.0.1:%d/tidemark?sslmode=disable", port)
	srv := &Server{Name: "durable", DataDir: dir}
	if srv.Settings, err = serverSettings(ctx, d.dsn); err != nil {
		d.stop()
		return nil, nil, err
	}
	out, err := d.run(ctx, filepath.Join(bin, "pg_test_fsync"), "-s", "1", "-f", filepath.Join(dir, "pg_test_fsync.out"))
	if err != nil {
		d.stop()
		return nil, nil, fmt.Errorf("pg_test_fsync: %v\n%s", err, out)
	}
	srv.FsyncTest = string(out)
	return d, srv, nil
}

// run runs a program, as the postgres user when the bench is root.
func (d *durablePG) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if d.asPG {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return cmd.CombinedOutput()
}

// stop stops the server (fast: no wait for clients) and removes its
// directory.
func (d *durablePG) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = d.run(ctx, filepath.Join(d.bin, "pg_ctl"), "-D", filepath.Join(d.dir, "data"), "-m", "fast", "-w", "stop")
	d.remove()
}

func (d *durablePG) remove() { _ = os.RemoveAll(d.dir) }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// serverSettings reads the settings that make commits cost what they
// cost.
func serverSettings(ctx context.Context, dsn string) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, errors.New("PostgreSQL does not answer (" + bedHint + ")")
	}
	defer conn.Close(ctx)
	out := map[string]string{}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes", "server_version"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// openTracedPool is openPool with tr counting its round trips.
func openTracedPool(ctx context.Context, dsn, schema string, tr *pgtrace.RoundTrips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the PostgreSQL connection string is not valid")
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL does not answer: %w (%s)", err, bedHint)
	}
	return pool, nil
}

// insertQueued is the inbox workload's effect as a QueuedEffect: the same
// statement, queued.
func insertQueued(rec runner.Record, b *pgx.Batch) error {
	b.Queue(effectSQL, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value)
	return nil
}

// inboxMode names an inbox consumer for the table.
func inboxMode(s childSpec) string {
	shape := "Effect"
	if s.Queued {
		shape = "QueuedEffect"
	}
	if s.Batch > 1 {
		return fmt.Sprintf("tidemark+inbox %s Batch(%d) over %s (%s, C=%d)", shape, s.Batch, s.Adapter, s.Order, s.Concurrency)
	}
	return fmt.Sprintf("tidemark+inbox %s 1/tx over %s (%s, C=%d)", shape, s.Adapter, s.Order, s.Concurrency)
}

// describeServer is a server's row heading: its name and settings.
func describeServer(s Server) string {
	return fmt.Sprintf("%s: fsync=%s synchronous_commit=%s", s.Name, s.Settings["fsync"], s.Settings["synchronous_commit"])
}
