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

// Readiness is a collector of locks_ready that runs the server's checks at each scrape.
func (s *Server) Readiness() prometheus.Collector { return readiness{s} }

type readiness struct{ s *Server }

func (r readiness) Describe(ch chan<- *prometheus.Desc) { ch <- readyDesc }

func (r readiness) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), readinessTimeout)
	defer cancel()
	for name, status := range r.s.Ready(ctx) {
		v := 0.0
		if status == "ok" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, v, name)
	}
}
