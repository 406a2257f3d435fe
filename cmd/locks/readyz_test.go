package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
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

// poolCalls counts what a pool sends Postgres: queries (as a pgx tracer), the pings it makes
// of connections idle for over a second before handing them out (pgxpool's default), and the
// connections it opens.
type poolCalls struct{ queries, pings, connects atomic.Int64 }

func (c *poolCalls) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}

func (c *poolCalls) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pool is a pool on url that counts its calls in c.
func (c *poolCalls) pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = c
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		if p.IdleDuration > time.Second {
			c.pings.Add(1)
			return true
		}
		return false
	}
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		c.connects.Add(1)
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// total is every call so far.
func (c *poolCalls) total() int64 { return c.queries.Load() + c.pings.Load() + c.connects.Load() }

// A flood of anonymous /readyz requests (1,000, 50 at a time) opens no new RabbitMQ
// connection beyond the checker's one, and costs Postgres no query beyond the checker's
// rounds, which run at most once per interval whatever the number of requests. What the
// pool sends is counted where it is sent: the database's own transaction count also counts
// other visitors (autovacuum's), which a loaded run showed.
//
// Not parallel: on a loaded machine the pool pings a connection that sat idle for over a
// second before it hands it out (pgxpool's default), and each ping is a call too.
func TestReadyzFloodOpensNothing(t *testing.T) {
	var calls poolCalls
	pool := calls.pool(t, testenv.PostgresURL(t))
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
	before := calls.total()

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
	if q := calls.queries.Load(); q < r {
		t.Fatalf("the checker's %d rounds sent %d queries: the pool's calls are not counted", r, q)
	}
	if got := calls.total() - before; got > r+2 {
		t.Errorf("%d requests cost %d Postgres calls (%d queries, %d pings, %d connections); the checker's %d rounds account for %d",
			requests, got, calls.queries.Load(), calls.pings.Load(), calls.connects.Load(), r, r)
	}
}
