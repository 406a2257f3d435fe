package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBin holds Debian's PostgreSQL 15 server binaries.
const pgBin = "/usr/lib/postgresql/15/bin"

// PostgresNode is a private PostgreSQL server (own data dir, port and socket dir, trust auth
// on loopback), so a test may kill and restart it without touching the shared server.
type PostgresNode struct {
	privateServer
	port int
	cred *syscall.Credential // the postgres user's, when the test runs as root
	// URL is the database "locks" on it (empty: `locks migrate` fills it).
	URL string
}

// PrivatePostgres initdbs and starts a Postgres server of t's own with an empty database
// "locks"; it is killed and removed at the end of the test.
func PrivatePostgres(t testing.TB) *PostgresNode {
	t.Helper()
	needBinary(t, filepath.Join(pgBin, "postgres"), "postgresql")
	n := &PostgresNode{privateServer: privateServer{t: t, dir: privateDir(t, "locks-test-pg-")}, port: freePort(t)}
	n.start = n.Start
	t.Cleanup(func() {
		n.Kill()
		_ = os.RemoveAll(n.dir)
	})
	// Postgres refuses to run as root: as root, the server and its files are the postgres user's.
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, Postgres needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		n.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(n.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	initdb := n.command("initdb", "-D", n.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v: %s", err, out)
	}
	n.Start()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, n.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE locks"); err != nil {
		t.Fatal(err)
	}
	n.URL = n.url("locks")
	return n
}

func (n *PostgresNode) data() string { return filepath.Join(n.dir, "data") }

func (n *PostgresNode) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.port, db)
}

// command runs a server binary as the user that owns the data.
func (n *PostgresNode) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(pgBin, bin), args...)
	cmd.Dir = n.dir
	if n.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.cred}
	}
	return cmd
}

// Start starts the server on its data dir (recovering from a crash, after Kill) and waits
// until it takes connections.
func (n *PostgresNode) Start() {
	n.t.Helper()
	// fsync off: a killed process loses nothing the kernel holds, and the disk is shared.
	cmd := n.command("postgres", "-D", n.data(), "-p", strconv.Itoa(n.port), "-k", n.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=300")
	n.proc = startPrivate(n.t, "private Postgres on port "+strconv.Itoa(n.port), n.dir, cmd, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, n.url("postgres"))
		if err == nil {
			_ = c.Close(ctx)
		}
		return err
	})
}
