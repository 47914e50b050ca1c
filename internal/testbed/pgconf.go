package testbed

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
)

func (p *PostgresState) mark() mark { return mark{"-D", p.Data} }

// pgMajor is the version number in /usr/lib/postgresql/<n>/bin, so that
// 15 sorts after 9.6; 0 when there is none.
func pgMajor(dir string) int {
	v := filepath.Base(filepath.Dir(dir))
	n, _ := strconv.ParseFloat(v, 64)
	return int(n * 100)
}

// pgDataDir is where the bed's data directory goes: Dir/pg/data, unless
// PostgreSQL's user cannot reach Dir/pg (a checkout under /root, say); then
// a directory under /tmp named after Dir.
func pgDataDir(dir string, reaches func(string) bool) string {
	if reaches(pgDir(dir)) {
		return filepath.Join(pgDir(dir), "data")
	}
	h := fnv.New32a()
	h.Write([]byte(dir))
	return filepath.Join(os.TempDir(), fmt.Sprintf("tidemark-testbed-%d", h.Sum32()), "data")
}

// pgHBA is the data directory's pg_hba.conf: trust on 127.0.0.1 only.
const pgHBA = "# Written by the test bed: trust on 127.0.0.1 only.\nhost all all 127.0.0.1/32 trust\n"

// pgConf is what the bed appends to postgresql.conf. Durability is not the
// point of a throwaway test server; speed is.
func pgConf(port int) string {
	return fmt.Sprintf(`
# The test bed (internal/testbed)
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = ''
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
`, port)
}

// initdbArgv is the command line that creates the data directory.
func initdbArgv(bin, data string) []string {
	return []string{filepath.Join(bin, "initdb"), "-D", data, "-U", pgUser, "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"}
}

// postgresArgv is the postmaster's command line; "-D" and the data
// directory mark it as ours.
func postgresArgv(p *PostgresState) []string {
	return []string{filepath.Join(p.Bin, "postgres"), "-D", p.Data}
}
