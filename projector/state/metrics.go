package state

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/stage"
)

type metrics struct {
	applied prometheus.Counter
	skipped *prometheus.CounterVec
	events  *prometheus.CounterVec
	batch   prometheus.Histogram
	commit  prometheus.Histogram
	lag     *prometheus.GaugeVec
	// lagSeconds is how long the newest message fetched had been in READINGS.
	lagSeconds *prometheus.GaugeVec
	// stage is this part's hop of locks_stage_seconds: received → committed.
	stage stage.Observer
	// rows are the sensor_state rows written, by why: change (the sensor had an event) or
	// seen (its liveness only, coalesced: seen.go).
	rows *prometheus.CounterVec
	// seenReplayed are rows whose deferred liveness was replayed from READINGS.
	seenReplayed prometheus.Counter
	// inMemory are messages applied without a transaction of their own (applyInMemory).
	inMemory prometheus.Counter
	// appliedSeq is the last sequence a partition applied, committed or in memory.
	appliedSeq *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_state_applied_total",
			Help: "READINGS messages applied to sensor_state."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_state_skipped_total",
			Help: "READINGS messages not applied: already_applied (at or below the checkpoint) or invalid (set aside)."}, []string{"reason"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_state_events_total",
			Help: "Events written to the outbox, by type."}, []string{"type"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_state_batch_size",
			Help: "READINGS messages per transaction.", Buckets: prometheus.ExponentialBuckets(1, 4, 7)}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_state_commit_seconds",
			Help: "Time of one batch transaction, begin to commit.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10)}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_state_lag_messages",
			Help: "READINGS messages of the partition not yet delivered to the state projector."}, []string{"partition"}),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_state_lag_seconds",
			Help: "Age of the newest READINGS message fetched by the state projector (0 when caught up)."}, []string{"partition"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_state_rows_written_total",
			Help: "sensor_state rows written, by why: change (the sensor had an event) or seen (liveness only, written at most every LOCKS_STATE_SEEN_INTERVAL)."}, []string{"why"}),
		seenReplayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_state_seen_replayed_total",
			Help: "sensor_state rows whose deferred liveness was replayed from READINGS after a restart, a takeover or a failed transaction."}),
		inMemory: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_state_applied_in_memory_total",
			Help: "READINGS messages applied without a transaction: their batch changed nothing but liveness, which a later transaction writes with the checkpoint (within LOCKS_STATE_SEEN_INTERVAL)."}),
		appliedSeq: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_state_applied_seq",
			Help: "READINGS sequence of the last message the state projector applied, by partition: its checkpoint, or beyond it by what was applied in memory."}, []string{"partition"}),
	}
	for _, c := range []prometheus.Collector{m.applied, m.skipped, m.events, m.batch, m.commit, m.lag, m.lagSeconds, m.rows, m.seenReplayed, m.inMemory, m.appliedSeq} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("state projector metrics: %w", err)
		}
	}
	var err error
	m.stage, err = stage.New(reg, stage.State)
	return m, err
}
