package history

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

type metrics struct {
	rows, batches, errors *prometheus.CounterVec
	skipped               *prometheus.CounterVec
	resets                *prometheus.CounterVec
	lag                   *prometheus.GaugeVec
	buffered              *prometheus.GaugeVec
	insertSeconds         *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_rows_written_total", Help: "Rows written to ClickHouse by the history projector.",
		}, []string{"table"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_batches_total", Help: "Successful INSERTs of the history projector.",
		}, []string{"table"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_insert_errors_total", Help: "Failed INSERT attempts: of rows (each is retried), or of positions (table history_positions; written anew with the next batch).",
		}, []string{"table"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_skipped_total", Help: "Messages acked without a row: not a reading, undecodable, or set aside (forged or malformed).",
		}, []string{"table", "reason"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_position_resets_total",
			Help: "Consumers started elsewhere than right after their position: written on another stream (other_stream) or ahead of it (ahead), both read again from the stream's first message, or before the stream's first message (truncated).",
		}, []string{"table", "reason"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "locks_history_lag_seconds",
			Help: "Age (by stream time) of the oldest message received but not yet written; 0 when none waits.",
		}, []string{"table"}),
		buffered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "locks_history_buffered_rows", Help: "Rows buffered for the next INSERT.",
		}, []string{"table"}),
		insertSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "locks_history_insert_seconds", Help: "Duration of successful INSERTs.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"table"}),
	}
	if err := part.Register(reg, "history", m.rows, m.batches, m.errors, m.skipped, m.resets, m.lag, m.buffered, m.insertSeconds); err != nil {
		return nil, err
	}
	return m, nil
}
