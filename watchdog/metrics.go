package watchdog

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

type metrics struct {
	refreshes, expiries, facts, refreshedOnCheck, alreadyDeclared, repairs prometheus.Counter
	coalesced, untracked, replaySkips                                      prometheus.Counter
	held, oldestHeld, queued                                               prometheus.Gauge
	declaredAtMaxHold                                                      prometheus.Counter
	delay, markerLag                                                       prometheus.Histogram
}

// newMetrics makes the watchdog's metrics and registers them on reg.
func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		refreshes: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_refreshes_total", Help: "Liveness keys refreshed by readings."}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_refreshes_coalesced_total", Help: "Readings whose key refresh was skipped: the key's deadline was within lost_after/4 of theirs."}),
		replaySkips: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_replayed_refreshes_skipped_total",
			Help: "Readings read again after a resume from an older position whose key already stood for them or a newer reading: not written again."}),
		untracked: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_untracked_readings_total",
			Help: "Readings the bridge marked untracked (unregistered, beyond LOCKS_UNREGISTERED_MAX): no liveness key."}),
		expiries:         prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_total", Help: "Liveness key expiries (limit markers) seen."}),
		facts:            prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_facts_total", Help: "liveness_timeout facts appended to READINGS."}),
		refreshedOnCheck: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_refreshed_total", Help: "Expiries dropped because READINGS held a reading younger than lost_after (our own lag)."}),
		alreadyDeclared:  prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_already_declared_total", Help: "Expiries dropped because the sensor's last message already is a liveness_timeout."}),
		repairs:          prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_reconcile_repairs_total", Help: "Differences between sensor_state and liveness keys repaired by the sweep; should stay 0."}),
		held:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_watchdog_held_expiries", Help: "Expiries held until the pipeline is caught up."}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_watchdog_settle_queue",
			Help: "Due expiries waiting for a settle worker (a burst of them: a power cut, a building's network down)."}),
		oldestHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_watchdog_held_expiry_oldest_seconds",
			Help: "How long the oldest held expiry has been held (0: none); at LOCKS_WATCHDOG_MAX_HOLD it is declared despite the lag."}),
		declaredAtMaxHold: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_declared_at_max_hold_total",
			Help: "liveness_timeout facts appended while the pipeline was still behind, because the expiry had been held for LOCKS_WATCHDOG_MAX_HOLD."}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_watchdog_declare_delay_seconds", Help: "From a sensor's deadline (last reading + lost_after) to its fact.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 5, 10, 30, 60, 300}}),
		markerLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_watchdog_marker_lag_seconds", Help: "From a sensor's deadline to the server's expiry marker of its key.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 5, 10, 30, 60, 300}}),
	}
	err := part.Register(reg, "watchdog", m.refreshes, m.coalesced, m.replaySkips, m.untracked, m.expiries, m.facts, m.refreshedOnCheck, m.alreadyDeclared,
		m.repairs, m.held, m.oldestHeld, m.queued, m.declaredAtMaxHold, m.delay, m.markerLag)
	return m, err
}
