package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestPoolCollector: the pool's metrics show an acquire that had to wait for a connection
// (the first, which opens one), one given up while the only connection was held, and the
// connection in use.
func TestPoolCollector(t *testing.T) {
	t.Parallel()
	pool := testenv.PostgresOneConn(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(poolCollector{map[string]*pgxpool.Pool{"shared": pool}})

	held, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if c, err := pool.Acquire(ctx); err == nil {
		c.Release()
		t.Fatal("a second connection from a pool of one")
	}
	want := map[string]float64{
		"locks_postgres_pool_acquires_total":          1,
		"locks_postgres_pool_empty_acquires_total":    1,
		"locks_postgres_pool_canceled_acquires_total": 1,
		"locks_postgres_pool_max_conns":               1,
		"locks_postgres_pool_acquired_conns":          1,
	}
	for name, v := range want {
		if got := gather(t, reg, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	if got := gather(t, reg, "locks_postgres_pool_empty_wait_seconds_total"); got <= 0 {
		t.Errorf("empty wait %v s, want > 0", got)
	}
}

// gather returns the value of the metric name in reg.
func gather(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestPoolSize(t *testing.T) {
	for _, c := range []struct {
		url        string
		parsed     int32
		partitions int
		want       int32
	}{
		{"postgres://h/db", 4, 16, 16 + poolSpare},
		{"postgres://h/db", 4, 4, 4 + poolSpare},
		{"postgres://h/db", 64, 4, 64}, // many CPUs: pgx's default is larger
		{"postgres://h/db?pool_max_conns=3", 3, 16, 3},
		{"host=h dbname=db pool_max_conns=5", 5, 16, 5},
	} {
		if got := poolSize(c.url, c.parsed, c.partitions); got != c.want {
			t.Errorf("poolSize(%q, %d, %d) = %d, want %d", c.url, c.parsed, c.partitions, got, c.want)
		}
	}
}

// TestOpenPostgresWarmsItsPools: with the notifier among the targets, the process opens a
// pool of its own for the notifier, of prewarmConns connections at most the shared pool's
// size; each pool opens its first connections at once, each connection already holding a
// generic plan over the partitions of its hot tables; the metrics tell the pools apart.
func TestOpenPostgresWarmsItsPools(t *testing.T) {
	t.Parallel()
	u := testenv.PostgresURL(t)
	parsed, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	shared := poolSize(u, parsed.MaxConns, 16) // pgx's default, raised to the partitions'
	for _, tc := range []struct {
		name    string
		url     string
		targets []string
		shared  int32
		notify  int32 // 0: no pool of the notifier's own
	}{
		{"defaults, all parts", u, allTargets, shared, min(shared, prewarmConns())},
		{"pool_max_conns bounds both", u + "&pool_max_conns=2", []string{"notifier", "state"}, 2, 2},
		{"no notifier", u, []string{"state"}, shared, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.PostgresURL, cfg.Partitions = tc.url, 16
			reg := prometheus.NewPedanticRegistry()
			pools, err := openPostgres(t.Context(), cfg, tc.targets, reg, ops.New("127.0.0.1:0", reg, testenv.Logger(t)), testenv.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pools.Close()
			if got := pools.shared.Config().MaxConns; got != tc.shared {
				t.Errorf("shared pool of %d, want %d", got, tc.shared)
			}
			if tc.notify == 0 {
				if pools.notifier != nil {
					t.Errorf("a notifier pool without the notifier")
				}
			} else if pools.notifier == nil || pools.notifier.Config().MaxConns != tc.notify {
				t.Fatalf("notifier pool %v, want one of %d", pools.notifier, tc.notify)
			}
			for name, p := range map[string]*pgxpool.Pool{"shared": pools.shared, "notifier": pools.notifier} {
				if p == nil {
					continue
				}
				want := min(p.Config().MaxConns, prewarmConns())
				if got := p.Stat().TotalConns(); got != want {
					t.Errorf("%s pool opened %d connections at start, want %d", name, got, want)
				}
				table := map[string]string{"shared": "sensor_state", "notifier": "notifier_deliveries"}[name]
				for _, c := range p.AcquireAllIdle(t.Context()) {
					var plans int64
					err := c.QueryRow(t.Context(), `SELECT coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
						WHERE statement LIKE '%FROM "' || $1 || '" WHERE sensor_id%'`, table).Scan(&plans)
					c.Release()
					if err != nil {
						t.Fatal(err)
					}
					if plans < 1 {
						t.Errorf("a connection of the %s pool has no generic plan over %s", name, table)
					}
				}
			}
			want := "# HELP locks_postgres_pool_max_conns The Postgres pool's size (pool_max_conns in LOCKS_POSTGRES_URL).\n" +
				"# TYPE locks_postgres_pool_max_conns gauge\n"
			if tc.notify > 0 {
				want += fmt.Sprintf("locks_postgres_pool_max_conns{pool=\"notifier\"} %d\n", tc.notify)
			}
			want += fmt.Sprintf("locks_postgres_pool_max_conns{pool=\"shared\"} %d\n", tc.shared)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "locks_postgres_pool_max_conns"); err != nil {
				t.Error(err)
			}
		})
	}
}
