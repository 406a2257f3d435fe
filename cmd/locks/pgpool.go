package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

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
