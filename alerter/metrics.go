package alerter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

type metrics struct {
	active      prometheus.Gauge
	firing      *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	evalErrors  *prometheus.CounterVec
	evaluations prometheus.Counter
	sent        *prometheus.CounterVec
	failures    *prometheus.CounterVec
	waiting     *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_alerter_active",
			Help: "1 while this process holds the alerter's lock and evaluates and sends the alerts."}),
		firing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_alerts_firing",
			Help: "Alerts firing, by kind (as of the last evaluation of this process)."}, []string{"kind"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_alert_transitions_total",
			Help: "Alerts fired and resolved, by kind and event."}, []string{"kind", "event"}),
		evalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_alert_evaluation_errors_total",
			Help: "Evaluations of an alert kind that failed (its alerts stayed as they were)."}, []string{"kind"}),
		evaluations: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_alert_evaluations_total",
			Help: "Evaluations of every alert condition by this process."}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_alert_notices_sent_total",
			Help: "Alert notices accepted by their channel (the SMTP server or the operator webhook)."}, []string{"channel"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_alert_notice_failures_total",
			Help: "Attempts of alert notices their channel refused or that failed; each is tried again."}, []string{"channel"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_alert_notices_waiting",
			Help: "Alert notices not sent yet (failing, or held back by LOCKS_ALERT_MAX_PER_MINUTE), by channel."}, []string{"channel"}),
	}
	if err := part.Register(reg, "alerter", m.active, m.firing, m.transitions, m.evalErrors, m.evaluations, m.sent, m.failures, m.waiting); err != nil {
		return nil, err
	}
	return m, nil
}
