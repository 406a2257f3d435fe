package ops

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// readyDesc is locks_ready{check}: the /readyz checks as a metric, so that Prometheus alerts
// on a dependency (NATS, Postgres, ClickHouse, RabbitMQ, a stopped projection partition)
// without probing /readyz itself.
var readyDesc = prometheus.NewDesc("locks_ready",
	"1 while the readiness check passes, 0 while it fails (the checks of /readyz).", []string{"check"}, nil)

// readinessTimeout bounds the checks one scrape runs, as /readyz does.
const readinessTimeout = 3 * time.Second

// ReadinessReuseDefault is how long one round of checks answers scrapes: the checks dial the
// databases and RabbitMQ, and a load generator scrapes every second.
const ReadinessReuseDefault = 10 * time.Second

// Readiness is a collector of locks_ready that answers a scrape with the last round of the
// server's checks if it is younger than reuse, else runs a round (shared with /readyz: at
// most one round runs at a time).
func (s *Server) Readiness(reuse time.Duration) prometheus.Collector {
	return &readiness{s: s, reuse: reuse}
}

type readiness struct {
	s     *Server
	reuse time.Duration
}

func (r *readiness) Describe(ch chan<- *prometheus.Desc) { ch <- readyDesc }

func (r *readiness) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), readinessTimeout)
	res, _ := r.s.rounds.get(ctx, r.reuse)
	cancel()
	for name, status := range res {
		v := 0.0
		if status == "ok" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, v, name)
	}
}
