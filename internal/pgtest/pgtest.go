// Package pgtest runs a PostgreSQL cluster of a test's own: initdb in a
// temporary directory, the server on a private port of 127.0.0.1 and a
// socket in that directory, stopped and removed when the test ends. No
// test touches a PostgreSQL the machine runs for other work.
//
// The server binaries are Debian's (/usr/lib/postgresql/VERSION/bin, the
// newest; scripts/ensure-postgres.sh installs them where missing) or
// those in $MESH_PG_BIN. PostgreSQL refuses to run as root, so a test run
// as root starts it as the postgres user (or nobody), who owns the
// directory.
//
//	dsn := pgtest.Start(t) // postgres://mesh@127.0.0.1:PORT/mesh?sslmode=disable
//	db, err := sql.Open("pgx", dsn)
package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"

	"github.com/meshkit/mesh/internal/freeport"
	"github.com/meshkit/mesh/internal/testdir"
)

// Bin is the directory of the PostgreSQL server binaries: $MESH_PG_BIN, or
// the newest of Debian's.
func Bin() (string, error) {
	if d := os.Getenv("MESH_PG_BIN"); d != "" {
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
	return "", fmt.Errorf("pgtest: no PostgreSQL server binaries (initdb): run scripts/ensure-postgres.sh (make test does), or set MESH_PG_BIN")
}

// Start initdbs and starts a cluster for t, with a superuser mesh (trusted
// on 127.0.0.1 alone) and a database mesh, and returns its URL. The
// cluster stops (immediately) and its directory goes when t ends.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		t.Fatal(err)
	}
	dir := testdir.Reachable(t)
	data := filepath.Join(dir, "data")
	var cred *syscall.Credential
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			t.Fatalf("pgtest: a user to run PostgreSQL as (it refuses root): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Fatalf("pgtest: %s %v: %v\n%s\n%s", name, args, err, out, log)
		}
	}
	run("initdb", "-D", data, "-U", "mesh", "--auth=trust", "--no-sync", "-E", "UTF8")
	port := freePort(t)
	run("pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", filepath.Join(dir, "server.log"), "-o",
		fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s -c fsync=off", port, dir))
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", data)
		cmd.Dir = dir
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("pgtest: stop the cluster: %v\n%s", err, out)
		}
	})
	run("createdb", "-h", dir, "-p", strconv.Itoa(port), "-U", "mesh", "mesh")
	return fmt.Sprintf("postgres://mesh@127.0.0.1:%d/mesh?sslmode=disable", port)
}

// freePort is a TCP port of 127.0.0.1 no one listened on a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	return freeport.Port(t)
}
