package natsx_test

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// LOCKS_NATS_SYNC reaches the embedded server's JetStream as the server itself reports it.
func TestEmbeddedSyncPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env      string // "" leaves the variable unset: the default
		always   bool
		interval time.Duration
	}{
		{env: "", always: true, interval: 2 * time.Minute},
		{env: "always", always: true, interval: 2 * time.Minute},
		{env: "ALWAYS", always: true, interval: 2 * time.Minute},
		{env: "10s", interval: 10 * time.Second},
		{env: "2m", interval: 2 * time.Minute},
	} {
		t.Run("sync="+tc.env, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Load(func(k string) string {
				if k == "LOCKS_NATS_SYNC" {
					return tc.env
				}
				return ""
			}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			ns, err := natsx.Embedded(t.TempDir(), "127.0.0.1:0", cfg.NATSSync, 4, testenv.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Shutdown()
			js := ns.JetStreamConfig()
			if js == nil {
				t.Fatal("embedded server runs without JetStream")
			}
			if js.SyncAlways != tc.always || js.SyncInterval != tc.interval {
				t.Fatalf("LOCKS_NATS_SYNC=%q: server has sync_always=%t sync_interval=%s, want %t and %s",
					tc.env, js.SyncAlways, js.SyncInterval, tc.always, tc.interval)
			}
		})
	}
}
