// Package testenv gives each test real servers: an embedded NATS server of its own, a fresh
// Postgres database cloned from a migrated template, its own RabbitMQ queue names, and its
// own migrated ClickHouse database. Postgres, RabbitMQ and ClickHouse are the local servers
// that `go tool task test` installs and starts (deploy/local/services.sh); their addresses
// can be changed with LOCKS_TEST_POSTGRES_URL, LOCKS_TEST_AMQP_URL and LOCKS_TEST_CLICKHOUSE_ADDR.
// When a server is missing the test fails and says how to get it; nothing is skipped.
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/migrations"
)

const howTo = "run `go tool task test` (it installs and starts the servers), or `bash deploy/local/services.sh`"

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Logger is a logger writing to the test log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Name is a random lower-case name with prefix, for databases and queues, stamped with the
// time (prune.go): prefix_<Unix seconds in base 36>_<8 random hex digits>.
func Name(prefix string) string {
	b := make([]byte, 4)
	_, _ = io.ReadFull(rand.Reader, b)
	return prefix + "_" + strconv.FormatInt(time.Now().Unix(), 36) + "_" + hex.EncodeToString(b)
}

// NATSEnv is an embedded NATS server with JetStream, private to one test.
type NATSEnv struct {
	t      testing.TB
	Server *server.Server
	URL    string
	NC     *nats.Conn
	JS     jetstream.JetStream
	dir    string
	port   int
}

// NATS starts an embedded NATS server for t, stopped at the end of the test.
func NATS(t testing.TB) *NATSEnv {
	t.Helper()
	// A reserved port (FreeAddr), so that a Restart finds it free again.
	e := &NATSEnv{t: t, dir: t.TempDir(), port: freePort(t)}
	e.start()
	nc, err := nats.Connect(e.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to embedded NATS: %v", err)
	}
	e.NC = nc
	e.JS, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nc.Close()
		e.Server.Shutdown()
		e.Server.WaitForShutdown()
	})
	return e
}

func (e *NATSEnv) start() {
	e.t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: e.port, JetStream: true, StoreDir: e.dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		e.t.Fatalf("embedded NATS: %v", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		e.t.Fatal("embedded NATS not ready within 10s")
	}
	e.Server, e.URL = ns, ns.ClientURL()
}

// JetStream opens a connection of its own to the NATS server at url, as a part's process
// would (natsx.Connect: it reconnects forever), closed at the end of the test; opts carry
// credentials.
func JetStream(t testing.TB, url, name string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := natsx.Connect(url, name, Logger(t), opts...)
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Restart stops the server and starts it again on the same port and store, as a crash and
// restart of NATS would; clients reconnect by themselves.
func (e *NATSEnv) Restart(down time.Duration) {
	e.t.Helper()
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
	time.Sleep(down)
	e.start()
}

var (
	pgOnce     sync.Once
	pgTemplate string
	pgErr      error
)

// PostgresAdminURL is the URL of the maintenance database of the test Postgres server.
func PostgresAdminURL() string { return pgAdminURL() }

// DropPostgresDatabase discards a database a test created by other means, into the trash
// that a janitor drops in the background (discardDatabase).
func DropPostgresDatabase(name string) {
	discardDatabase(context.Background(), name)
}

func pgAdminURL() string {
	return env("LOCKS_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
}

// migrationsDigest names the template after the migrations, so a changed schema gets a new one.
func migrationsDigest(fsys fs.FS) string {
	h := sha256.New()
	_ = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(fsys, p)
		h.Write([]byte(p))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func ensureTemplate(ctx context.Context) (string, error) {
	name := "locks_tmpl_" + migrationsDigest(migrations.Postgres())
	conn, err := pgx.Connect(ctx, pgAdminURL())
	if err != nil {
		return "", fmt.Errorf("Postgres at %s is not reachable (%v): %s", pgAdminURL(), err, howTo)
	}
	defer conn.Close(ctx)
	// Test binaries of several packages run at once: one builds the template, the others wait.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(74201)"); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(74201)") //nolint:errcheck
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&ok); err != nil {
		return "", err
	}
	if ok {
		return name, nil
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
		return "", err
	}
	u := strings.Replace(pgAdminURL(), "/postgres?", "/"+name+"?", 1)
	if err := migrations.MigratePostgres(ctx, u, slog.New(slog.DiscardHandler)); err != nil {
		return "", fmt.Errorf("migrate template %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+name+" WITH is_template = true ALLOW_CONNECTIONS = false"); err != nil {
		return "", err
	}
	return name, nil
}

// PostgresURL creates a fresh, migrated database for t (discarded at the end) and returns its URL.
func PostgresURL(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	pgOnce.Do(func() {
		c, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		pgTemplate, pgErr = ensureTemplate(c)
	})
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	prunePostgres()
	name := Name("locks_test")
	conn, err := pgx.Connect(ctx, pgAdminURL())
	if err != nil {
		t.Fatalf("Postgres at %s is not reachable (%v): %s", pgAdminURL(), err, howTo)
	}
	defer conn.Close(ctx)
	for i := 0; ; i++ {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+pgTemplate)
		var pe *pgconn.PgError
		// Another test copying the same template at this instant: try again.
		if errors.As(err, &pe) && pe.Code == "55006" && i < 50 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() { discardDatabase(ctx, name) })
	return strings.Replace(pgAdminURL(), "/postgres?", "/"+name+"?", 1)
}

// Postgres is PostgresURL plus a pool on it, closed at the end of the test.
func Postgres(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	u := PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return u, pool
}

// PostgresOneConn is a pool of a single connection on a database of the test's own (as
// PostgresURL), closed at the end of the test: every call runs on the same connection, for
// tests of what a statement leaves on it.
func PostgresOneConn(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// RabbitEnv is a RabbitMQ server with queue names private to one test.
type RabbitEnv struct {
	URL          string
	Queue        string // sensor readings queue for this test
	InvalidQueue string
	Conn         *amqp.Connection
}

// AMQPURL is the RabbitMQ the tests use.
func AMQPURL() string { return env("LOCKS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// RabbitMQ gives t its own queue names on the local RabbitMQ; they are deleted at the end.
func RabbitMQ(t testing.TB) *RabbitEnv {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is not reachable (%v): %s", AMQPURL(), err, howTo)
	}
	q := Name("sensor.readings")
	e := &RabbitEnv{URL: AMQPURL(), Queue: q, InvalidQueue: q + ".invalid", Conn: conn}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(e.Queue, false, false, false)
			_, _ = ch.QueueDelete(e.InvalidQueue, false, false, false)
		}
		_ = conn.Close()
	})
	return e
}

// ClickHouseAddr is the native-protocol address of the ClickHouse the tests use.
func ClickHouseAddr() string { return env("LOCKS_TEST_CLICKHOUSE_ADDR", "127.0.0.1:9000") }

// DropClickHouseDatabase drops a database a test created by other means.
func DropClickHouseDatabase(t testing.TB, name string) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ClickHouseAddr()}})
	if err != nil {
		t.Errorf("drop %s: %v", name, err)
		return
	}
	defer conn.Close()
	if err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		t.Errorf("drop %s: %v", name, err)
	}
}

// ClickHouse creates a migrated database for t (dropped at the end) and returns its
// clickhouse:// URL and a native connection to it.
func ClickHouse(t testing.TB) (string, driver.Conn) {
	t.Helper()
	ctx := context.Background()
	pruneClickHouse()
	name := Name("locks_test")
	u := "clickhouse://" + ClickHouseAddr() + "/" + name
	if err := migrations.MigrateClickHouse(ctx, u, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("ClickHouse at %s: %v: %s", ClickHouseAddr(), err, howTo)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ClickHouseAddr()}, Auth: clickhouse.Auth{Database: name}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
		_ = conn.Close()
	})
	return u, conn
}

// Eventually polls cond every 20 ms until it holds, and fails t if it does not within d.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunPart runs a part's Run in the background until the returned stop is called or the
// test ends; stop cancels it and fails t if Run returns an error or does not return
// within grace.
func RunPart(t testing.TB, name string, run func(context.Context) error, grace time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", name, err)
				}
			case <-time.After(grace):
				t.Errorf("%s did not stop within %s", name, grace)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
