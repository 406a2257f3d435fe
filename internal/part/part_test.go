package part

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRequire(t *testing.T) {
	t.Parallel()
	var nilLogger *slog.Logger
	var nilIface interface{ Info(string, ...any) } = nilLogger
	if err := Require("bridge", Dep{"Logger", slog.Default()}, Dep{"Registerer", 1}); err != nil {
		t.Fatalf("all present: %v", err)
	}
	err := Require("bridge", Dep{"JS", nil}, Dep{"Logger", nilLogger}, Dep{"Registerer", nilIface}, Dep{"PG", slog.Default()})
	if !errors.Is(err, ErrMissingDep) || !strings.Contains(err.Error(), "bridge: missing dependency: JS, Logger, Registerer") {
		t.Fatalf("Require = %v, want ErrMissingDep naming JS, Logger, Registerer", err)
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := Register(reg, "x", a, b); err != nil {
		t.Fatal(err)
	}
	err := Register(reg, "lease state", prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"}))
	if err == nil || !strings.Contains(err.Error(), "lease state: register metrics") {
		t.Fatalf("duplicate registration: %v, want an error naming lease state", err)
	}
}
