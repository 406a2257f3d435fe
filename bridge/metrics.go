package bridge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/stage"
)

type metrics struct {
	accepted   prometheus.Counter
	invalid    *prometheus.CounterVec
	duplicates prometheus.Counter
	latency    prometheus.Histogram
	inFlight   prometheus.Gauge
	standby    prometheus.Gauge
	connects   prometheus.Counter
	retries    prometheus.Counter
	// batches and batchFailures count atomic batches committed and failed (batch.go).
	batches       prometheus.Counter
	batchFailures prometheus.Counter
	// sensorStage and appendStage are this part's hops of locks_stage_seconds.
	sensorStage, appendStage stage.Observer
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_readings_accepted_total",
			Help: "Valid readings appended to READINGS (duplicates included) and acked.",
		}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_bridge_invalid_total",
			Help: "Invalid messages moved to the invalid queue, by reason.",
		}, []string{"reason"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_duplicates_total",
			Help: "Appends JetStream recognised as already recorded (a redelivery or a retry).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "locks_bridge_publish_seconds",
			Help:    "Time from the async append to JetStream's ack.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "locks_bridge_standby",
			Help: "1 while another bridge process consumes the queue and this one stands by to take over.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "locks_bridge_in_flight",
			Help: "Messages received and not yet acked to RabbitMQ.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_amqp_connects_total",
			Help: "Successful RabbitMQ sessions started (the first and every reconnect).",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_publish_retries_total",
			Help: "Appends retried after a failed or timed-out JetStream publish.",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_batches_total",
			Help: "Atomic batches of readings appended to READINGS (when the stream allows them).",
		}),
		batchFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_batch_failures_total",
			Help: "Atomic batches refused or unanswered; their readings were retried one by one.",
		}),
	}
	for _, reason := range []string{ReasonTooBig, ReasonNotJSON, ReasonSensorID, ReasonData, ReasonTS, ReasonMessageID, ReasonUnregistered} {
		m.invalid.WithLabelValues(reason)
	}
	for _, c := range []prometheus.Collector{m.accepted, m.invalid, m.duplicates, m.latency, m.inFlight, m.standby, m.connects, m.retries, m.batches, m.batchFailures} {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("bridge metrics: %w", err)
		}
	}
	var err error
	if m.sensorStage, err = stage.New(reg, stage.Sensor); err != nil {
		return m, err
	}
	m.appendStage, err = stage.New(reg, stage.Append)
	return m, err
}
