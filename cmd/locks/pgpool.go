package main

import (
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolSpare is the connections the process's pool has beyond one per partition: for the
// outbox relay, the notifier, the watchdog, the api and the alerter.
const poolSpare = 8

// poolSize is the Postgres pool's size: pool_max_conns when the URL sets it, else one
// connection per partition plus poolSpare (at least pgx's default). With pgx's max(4, CPUs)
// the state projector's partitions, each a transaction at a time, waited for a connection
// on every reading in the e2e bench. Connections are opened only as they are needed: the
// size is a bound.
func poolSize(url string, parsed int32, partitions int) int32 {
	if strings.Contains(url, "pool_max_conns") {
		return parsed
	}
	return max(parsed, int32(partitions+poolSpare))
}

// notifierPoolSize is the webhook notifier's own pool (postgresPools): prewarmConns, at most
// the shared pool's size.
func notifierPoolSize(shared int32) int32 { return min(shared, prewarmConns()) }

// prewarmConns is how many connections a pool opens at start: pgx's default pool size,
// max(4, CPUs), and two more.
func prewarmConns() int32 { return int32(max(4, runtime.NumCPU()) + 2) }

// poolCollector shows whether the process's Postgres pools (label pool: shared, notifier)
// make the parts wait for a connection: acquires that found none idle, and the time spent
// waiting.
type poolCollector struct{ pools map[string]*pgxpool.Pool }

var (
	poolLabel        = []string{"pool"}
	poolAcquiresDesc = prometheus.NewDesc("locks_postgres_pool_acquires_total",
		"Connections taken from the Postgres pool.", poolLabel, nil)
	poolEmptyDesc = prometheus.NewDesc("locks_postgres_pool_empty_acquires_total",
		"Acquires that found no idle connection and waited for one (or for a new one).", poolLabel, nil)
	poolWaitDesc = prometheus.NewDesc("locks_postgres_pool_empty_wait_seconds_total",
		"Time the empty acquires waited for a connection.", poolLabel, nil)
	poolCanceledDesc = prometheus.NewDesc("locks_postgres_pool_canceled_acquires_total",
		"Acquires given up (their context ended) before a connection was free.", poolLabel, nil)
	poolMaxDesc = prometheus.NewDesc("locks_postgres_pool_max_conns",
		"The Postgres pool's size (pool_max_conns in LOCKS_POSTGRES_URL).", poolLabel, nil)
	poolUsedDesc = prometheus.NewDesc("locks_postgres_pool_acquired_conns",
		"Connections of the Postgres pool in use now.", poolLabel, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquiresDesc, poolEmptyDesc, poolWaitDesc, poolCanceledDesc, poolMaxDesc, poolUsedDesc} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, pool := range c.pools {
		s := pool.Stat()
		ch <- prometheus.MustNewConstMetric(poolAcquiresDesc, prometheus.CounterValue, float64(s.AcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolEmptyDesc, prometheus.CounterValue, float64(s.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolWaitDesc, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(poolCanceledDesc, prometheus.CounterValue, float64(s.CanceledAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolMaxDesc, prometheus.GaugeValue, float64(s.MaxConns()), name)
		ch <- prometheus.MustNewConstMetric(poolUsedDesc, prometheus.GaugeValue, float64(s.AcquiredConns()), name)
	}
}
