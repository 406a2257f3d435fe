package part

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
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
