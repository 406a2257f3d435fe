package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// A sync policy or clock skew that means nothing stops the process with one line naming the
// variable and what it accepts, before any store is opened.
func TestBadSyncAndSkewAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ k, v, says string }{
		{"LOCKS_NATS_SYNC", "sometimes", `must be "always" or a duration`},
		{"LOCKS_NATS_SYNC", "0s", `must be "always" or a duration`},
		{"LOCKS_NATS_SYNC", "-2m", `must be "always" or a duration`},
		{"LOCKS_NATS_SYNC", "never", `must be "always" or a duration`},
		{"LOCKS_CLOCK_SKEW_MAX", "5", "not a duration"},
		{"LOCKS_CLOCK_SKEW_MAX", "-1m", "must be positive"},
	} {
		t.Run(tc.k+"="+tc.v, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(func(k string) string {
				if k == tc.k {
					return tc.v
				}
				return ""
			}, nil, nil)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Var != tc.k || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s=%q: error %v, want one line naming %s that says %q", tc.k, tc.v, err, tc.k, tc.says)
			}
		})
	}
	c := config.Default()
	if c.ClockSkewMax.String() != "5m0s" || c.NATSSync.String() != "always" {
		t.Fatalf("defaults: clock skew %s, NATS sync %s", c.ClockSkewMax, c.NATSSync)
	}
}
