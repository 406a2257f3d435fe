package main

import (
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

// poolCollector shows whether the process's one Postgres pool, shared by every part, makes
// them wait for a connection: acquires that found none idle, and the time spent waiting.
type poolCollector struct{ pool *pgxpool.Pool }

var (
	poolAcquiresDesc = prometheus.NewDesc("locks_postgres_pool_acquires_total",
		"Connections taken from the Postgres pool.", nil, nil)
	poolEmptyDesc = prometheus.NewDesc("locks_postgres_pool_empty_acquires_total",
		"Acquires that found no idle connection and waited for one (or for a new one).", nil, nil)
	poolWaitDesc = prometheus.NewDesc("locks_postgres_pool_empty_wait_seconds_total",
		"Time the empty acquires waited for a connection.", nil, nil)
	poolCanceledDesc = prometheus.NewDesc("locks_postgres_pool_canceled_acquires_total",
		"Acquires given up (their context ended) before a connection was free.", nil, nil)
	poolMaxDesc = prometheus.NewDesc("locks_postgres_pool_max_conns",
		"The Postgres pool's size (pool_max_conns in LOCKS_POSTGRES_URL).", nil, nil)
	poolUsedDesc = prometheus.NewDesc("locks_postgres_pool_acquired_conns",
		"Connections of the Postgres pool in use now.", nil, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquiresDesc, poolEmptyDesc, poolWaitDesc, poolCanceledDesc, poolMaxDesc, poolUsedDesc} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(poolAcquiresDesc, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(poolEmptyDesc, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(poolWaitDesc, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
	ch <- prometheus.MustNewConstMetric(poolCanceledDesc, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
	ch <- prometheus.MustNewConstMetric(poolMaxDesc, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(poolUsedDesc, prometheus.GaugeValue, float64(s.AcquiredConns()))
}
