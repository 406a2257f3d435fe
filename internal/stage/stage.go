// Package stage measures where a reading waits on its way from RabbitMQ to the webhook: one
// histogram, locks_stage_seconds{stage}, that every part on the path observes into, so the
// whole way can be read as a sum of its hops (docs/monitoring.md lists them).
package stage

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The hops of a reading's way, in order. Each is measured between two clocks of the same
// machine except Sensor, which starts at the sensor's own ts.
const (
	Sensor  = "sensor"  // the reading's ts → the bridge received it
	Append  = "append"  // the bridge received it → JetStream acked its READINGS append
	State   = "state"   // the bridge received it → the state projector committed it
	Relay   = "relay"   // the event committed to the outbox → JetStream acked it on EVENTS
	Intake  = "intake"  // the event stored on EVENTS → the notifier committed its deliveries
	Claim   = "claim"   // a delivery committed → its attempt started
	Attempt = "attempt" // an attempt started → the receiver answered
	Finish  = "finish"  // the receiver answered → the outcome committed
)

var names = []string{Sensor, Append, State, Relay, Intake, Claim, Attempt, Finish}

// Observer is one hop's histogram.
type Observer struct{ o prometheus.Observer }

// New returns the observer of stage, registering the shared histogram on reg the first time
// (several parts of one process share it).
func New(reg prometheus.Registerer, name string) (Observer, error) {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "locks_stage_seconds",
		Help:    "Time a reading or its event spends in each hop of its way to the webhook, by stage (sensor, append, state, relay, intake, claim, attempt, finish).",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30},
	}, []string{"stage"})
	if err := reg.Register(v); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return Observer{}, fmt.Errorf("stage metrics: %w", err)
		}
		v = are.ExistingCollector.(*prometheus.HistogramVec)
	}
	for _, n := range names {
		v.WithLabelValues(n) // every stage shows, even before its first observation
	}
	return Observer{v.WithLabelValues(name)}, nil
}

// Since observes the time from t to now; a zero t, or one in the future (a clock that
// disagrees), is not observed.
func (o Observer) Since(t time.Time) { o.Between(t, time.Now()) }

// Between observes end − start when it is not negative and start is set.
func (o Observer) Between(start, end time.Time) {
	if o.o == nil || start.IsZero() || end.Before(start) {
		return
	}
	o.o.Observe(end.Sub(start).Seconds())
}
