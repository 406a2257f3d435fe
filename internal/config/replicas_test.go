package config_test

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// LOCKS_NATS_REPLICAS: 1 by default, 1 to 5 (JetStream's range), and above 1 only against an
// external NATS (the embedded server is one server, where JetStream refuses replicas).
func TestNATSReplicas(t *testing.T) {
	t.Parallel()
	if got := config.Default().NATSReplicas; got != 1 {
		t.Fatalf("default LOCKS_NATS_REPLICAS = %d, want 1", got)
	}
	const cluster = "nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"
	for _, tc := range []struct {
		env, url string
		want     int // 0: refused
	}{
		{"1", "", 1}, {"3", cluster, 3}, {"5", cluster, 5},
		{"0", cluster, 0}, {"6", cluster, 0}, {"-1", cluster, 0}, {"three", cluster, 0},
		{"3", "", 0},
	} {
		c, err := config.Load(func(k string) string {
			return map[string]string{"LOCKS_NATS_REPLICAS": tc.env, "LOCKS_NATS_URL": tc.url}[k]
		}, nil, nil)
		switch {
		case tc.want == 0 && (!errors.Is(err, config.ErrUsage) || !strings.Contains(err.Error(), "LOCKS_NATS_REPLICAS")):
			t.Errorf("LOCKS_NATS_REPLICAS=%s LOCKS_NATS_URL=%q: %v, want an error naming the variable", tc.env, tc.url, err)
		case tc.want != 0 && (err != nil || c.NATSReplicas != tc.want):
			t.Errorf("LOCKS_NATS_REPLICAS=%s LOCKS_NATS_URL=%q: %d, %v; want %d", tc.env, tc.url, c.NATSReplicas, err, tc.want)
		}
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--nats-replicas=3", "--nats-url=" + cluster}); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(func(string) string { return "" }, fs, vals)
	if err != nil || c.NATSReplicas != 3 {
		t.Fatalf("--nats-replicas=3: %d, %v; want 3", c.NATSReplicas, err)
	}
}
