package ops_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// locks_ready follows each readiness check, for Prometheus alerts; with a reuse period, one
// round of checks answers the scrapes within it.
func TestReadinessMetricFollowsChecks(t *testing.T) {
	t.Parallel()
	reg, cached := prometheus.NewRegistry(), prometheus.NewRegistry()
	// Two servers: one server's collectors share its rounds of checks.
	s, s2 := ops.New("127.0.0.1:0", reg, testenv.Logger(t)), ops.New("127.0.0.1:0", cached, testenv.Logger(t))
	reg.MustRegister(s.Readiness(0))
	cached.MustRegister(s2.Readiness(time.Hour))
	var down atomic.Bool
	down.Store(true)
	for _, s := range []*ops.Server{s, s2} {
		s.AddCheck("postgres", func(context.Context) error {
			if down.Load() {
				return errors.New("connection refused")
			}
			return nil
		})
		s.AddCheck("nats", func(context.Context) error { return nil })
	}
	ready := func(g prometheus.Gatherer) map[string]float64 {
		mfs, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "locks_ready" {
				continue
			}
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	if got := ready(reg); got["nats"] != 1 || got["postgres"] != 0 || len(got) != 2 {
		t.Fatalf("with postgres failing, locks_ready = %v", got)
	}
	if got := ready(cached); got["postgres"] != 0 {
		t.Fatalf("with postgres failing, cached locks_ready = %v", got)
	}
	down.Store(false)
	if got := ready(reg); got["nats"] != 1 || got["postgres"] != 1 {
		t.Fatalf("with every check passing, locks_ready = %v", got)
	}
	if got := ready(cached); got["postgres"] != 0 {
		t.Fatalf("within the reuse period, locks_ready = %v; want the first round's 0", got)
	}
}
