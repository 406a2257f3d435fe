package notifier

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// MetricsMaxClientsDefault is Config.MetricsMaxClients (LOCKS_METRICS_MAX_CLIENTS).
const MetricsMaxClientsDefault = 100

// otherClients is the client label of the clients beyond MetricsMaxClients.
const otherClients = "other"

// clientMetrics are the per-client attempt counters and latencies, with bounded label
// cardinality: the first max clients this process records get a label of their own, the
// rest are summed under client="other" (a process's series stay bounded whatever the number
// of clients; the API's GET /v1/clients/{id}/stats has every client's figures).
type clientMetrics struct {
	attempts *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	max    int
	mu     sync.Mutex
	labels map[string]struct{}
}

func newClientMetrics(max int) *clientMetrics {
	return &clientMetrics{
		max: max, labels: map[string]struct{}{},
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_notifier_client_attempts_total",
			Help: "Webhook attempt records per client (the first LOCKS_METRICS_MAX_CLIENTS, the rest as client=\"other\"), by outcome (delivered, retry, dead, cancelled, superseded)."},
			[]string{"client", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "locks_notifier_client_attempt_duration_seconds",
			Help:    "Duration of webhook HTTP attempts per client (the first LOCKS_METRICS_MAX_CLIENTS, the rest as client=\"other\").",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"client"}),
	}
}

func (cm *clientMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{cm.attempts, cm.latency}
}

// label is client's label value: its id while there is room, else "other".
func (cm *clientMetrics) label(client string) string {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if _, ok := cm.labels[client]; ok {
		return client
	}
	if len(cm.labels) < cm.max {
		cm.labels[client] = struct{}{}
		return client
	}
	return otherClients
}

// count records attempt records; those of an HTTP attempt (delivered, retry, dead) add
// their latency.
func (cm *clientMetrics) count(recs []event.Attempt) {
	for _, a := range recs {
		l := cm.label(a.ClientID)
		cm.attempts.WithLabelValues(l, a.Outcome).Inc()
		switch a.Outcome {
		case event.OutcomeDelivered, event.OutcomeRetry, event.OutcomeDead:
			cm.latency.WithLabelValues(l).Observe(float64(a.LatencyMS) / 1000)
		}
	}
}
