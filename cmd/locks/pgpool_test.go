package main

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestPoolCollector: the pool's metrics show an acquire that had to wait for a connection
// (the first, which opens one), one given up while the only connection was held, and the
// connection in use.
func TestPoolCollector(t *testing.T) {
	t.Parallel()
	pool := testenv.PostgresOneConn(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(poolCollector{pool})

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
