package bridge

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClockSkewMaxDefault is how far a reading's ts may be from its receive time before it is
// counted as a skewed sensor clock: generous for a sensor that buffers a few readings while
// its link is down, tight enough to catch a clock reset to 1970 or set years ahead.
const ClockSkewMaxDefault = 5 * time.Minute

// clockSkew counts readings whose sensor clock is off. Nothing else changes for them: ts is
// stored as sent, and ordering, history partitions and liveness use the receive time
// (docs/contract.md section 1), so a metric is what tells an operator which fleet needs its clocks set.
type clockSkew struct {
	max           time.Duration
	behind, ahead prometheus.Counter
}

func newClockSkew(limit time.Duration, reg prometheus.Registerer) (*clockSkew, error) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "locks_bridge_clock_skew_total",
		Help: "Valid readings whose ts is more than the allowed skew (LOCKS_CLOCK_SKEW_MAX) behind or ahead of their receive time.",
	}, []string{"direction"})
	if err := reg.Register(v); err != nil {
		return nil, fmt.Errorf("bridge metrics: %w", err)
	}
	return &clockSkew{max: limit, behind: v.WithLabelValues("behind"), ahead: v.WithLabelValues("ahead")}, nil
}

// observe counts r if its ts (when it sent one) is too far from its receive time.
func (c *clockSkew) observe(r Reading) {
	switch d := r.Time.Sub(r.ReceivedTime); {
	case d < -c.max:
		c.behind.Inc()
	case d > c.max:
		c.ahead.Inc()
	}
}
