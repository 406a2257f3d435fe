package logread

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Gaps counts a part's broken runs in locks_log_gaps_total{part} (one collector per
// registry, whichever part registers it first) and makes their Spec.OnGap.
type Gaps struct {
	n   prometheus.Counter
	log *slog.Logger
}

// NewGaps registers part's count of broken runs on reg.
func NewGaps(reg prometheus.Registerer, log *slog.Logger, part string) (*Gaps, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_log_gaps_total",
		Help: "Runs of a consumer's messages that broke (a delivery lost in flight, a redelivery, the consumer gone) and were resumed from the last processed message, by part."},
		[]string{"part"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return &Gaps{n: c.WithLabelValues(part), log: log}, nil
}

// OnGap is the Spec.OnGap of consumer: it logs and counts each broken run.
func (g *Gaps) OnGap(consumer string) func(reason string) {
	return func(reason string) {
		g.n.Inc()
		g.log.Warn("a run of the log broke; resuming from the last processed message", "consumer", consumer, "reason", reason)
	}
}
