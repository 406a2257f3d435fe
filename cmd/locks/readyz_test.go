package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// countingProxy forwards TCP connections to target and counts those it accepted.
func countingProxy(t *testing.T, target string) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

// xactCommits reads the committed transactions of database db, from a fresh statistics
// snapshot.
func xactCommits(t *testing.T, admin *pgx.Conn, db string) int64 {
	t.Helper()
	if _, err := admin.Exec(t.Context(), "SELECT pg_stat_clear_snapshot()"); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := admin.QueryRow(t.Context(), "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", db).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A flood of anonymous /readyz requests (1,000, 50 at a time) opens no new RabbitMQ
// connection beyond the checker's one, and costs Postgres no query beyond the checker's
// rounds, which run at most once per interval whatever the number of requests.
//
// Not parallel: on a loaded machine the pool pings a connection that sat idle for over a
// second before it hands it out (pgxpool's default), and each ping is a transaction too.
func TestReadyzFloodOpensNothing(t *testing.T) {
	pgURL := testenv.PostgresURL(t)
	pu, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(pu.Path, "/")
	admin, err := pgx.Connect(t.Context(), testenv.PostgresAdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(t.Context()))
	pool, err := pgxpool.New(t.Context(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	au, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, amqpConns := countingProxy(t, au.Host)
	au.Host = proxy
	probe := newAMQPProbe(au.String())
	defer probe.Close()

	srv := ops.New("127.0.0.1:0", prometheus.NewRegistry(), testenv.Logger(t))
	var rounds atomic.Int64
	srv.AddCheck("postgres", func(ctx context.Context) error {
		rounds.Add(1)
		return migrations.PostgresReady(ctx, pool)
	})
	srv.AddCheck("rabbitmq", probe.Check)
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = srv.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := xactCommits(t, admin, db)

	const requests, workers = 1000, 50
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= requests {
				resp, err := http.Get(base + "/readyz")
				if err != nil {
					bad.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of %d /readyz requests failed or were not 200", n, requests)
	}
	if n := amqpConns.Load(); n != 1 {
		t.Errorf("%d requests opened %d RabbitMQ connections, want the checker's one", requests, n)
	}
	r := rounds.Load()
	if most := int64(elapsed/ops.ReadyEveryDefault) + 2; r > most {
		t.Errorf("%d requests in %s ran %d rounds of checks, want at most one per %s (%d)", requests, elapsed, r, ops.ReadyEveryDefault, most)
	}
	// The pool's sessions report their statistics when they end.
	pool.Close()
	var after int64
	testenv.Eventually(t, 10*time.Second, "the checker's queries in pg_stat_database", func() bool {
		after = xactCommits(t, admin, db)
		return after-before >= r
	})
	if got := after - before; got > r+2 {
		t.Errorf("%d requests cost %d Postgres transactions; the checker's %d rounds account for %d", requests, got, r, r)
	}
}
