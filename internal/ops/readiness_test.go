package ops_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// locks_ready follows each readiness check at every scrape, for Prometheus alerts.
func TestReadinessMetricFollowsChecks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := ops.New("127.0.0.1:0", reg, testenv.Logger(t))
	reg.MustRegister(s.Readiness())
	var down atomic.Bool
	down.Store(true)
	s.AddCheck("postgres", func(context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	})
	s.AddCheck("nats", func(context.Context) error { return nil })
	ready := func() map[string]float64 {
		mfs, err := reg.Gather()
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
	if got := ready(); got["nats"] != 1 || got["postgres"] != 0 || len(got) != 2 {
		t.Fatalf("with postgres failing, locks_ready = %v", got)
	}
	down.Store(false)
	if got := ready(); got["nats"] != 1 || got["postgres"] != 1 {
		t.Fatalf("with every check passing, locks_ready = %v", got)
	}
}
