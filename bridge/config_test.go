package bridge

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := Config{AMQPURL: "amqp://x", Queue: "q", ReconnectMin: 20 * ReconnectMaxDefault}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.InvalidQueue != "q.invalid" || c.Prefetch != PrefetchDefault || c.MaxInFlight != PrefetchDefault ||
		c.ConnectionName != ConnectionNameDefault || c.PublishTimeout != PublishTimeoutDefault ||
		c.DrainTimeout != DrainTimeoutDefault || c.InvalidMaxLength != InvalidMaxLengthDefault ||
		c.ClockSkewMax != ClockSkewMaxDefault {
		t.Fatalf("defaults not applied: %+v", c)
	}
	// A minimum above the default maximum raises the maximum to it.
	if c.ReconnectMax != c.ReconnectMin {
		t.Fatalf("ReconnectMax %v, want ReconnectMin %v", c.ReconnectMax, c.ReconnectMin)
	}
	for _, bad := range []Config{{Queue: "q"}, {AMQPURL: "amqp://x"}, {AMQPURL: "amqp://x", Queue: "q", InvalidQueue: "q"}} {
		bad.setDefaults()
		if bad.Validate() == nil {
			t.Errorf("%+v: want an error", bad)
		}
	}
}

func TestNewNamesMissingDeps(t *testing.T) {
	t.Parallel()
	cfg := Config{AMQPURL: "amqp://x", Queue: "q"}
	_, err := New(cfg, Deps{Logger: slog.Default()})
	if !errors.Is(err, part.ErrMissingDep) {
		t.Fatalf("err %v, want ErrMissingDep", err)
	}
	if !strings.Contains(err.Error(), "JS") || !strings.Contains(err.Error(), "PG") || !strings.Contains(err.Error(), "Registerer") ||
		strings.Contains(err.Error(), "Logger") {
		t.Fatalf("err %q should name JS, PG and Registerer only", err)
	}
	if _, err := New(Config{}, Deps{Registerer: prometheus.NewRegistry()}); err == nil || errors.Is(err, part.ErrMissingDep) {
		t.Fatalf("a bad config is reported before the deps: %v", err)
	}
}
