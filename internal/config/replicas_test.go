package config_test

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestNATSReplicas(t *testing.T) {
	t.Parallel()
	if got := config.Default().NATSReplicas; got != 1 {
		t.Fatalf("default LOCKS_NATS_REPLICAS = %d, want 1", got)
	}
	for _, tc := range []struct {
		env  string
		want int // 0: refused
	}{
		{"1", 1}, {"3", 3}, {"5", 5}, {"0", 0}, {"6", 0}, {"-1", 0}, {"three", 0},
	} {
		c, err := config.Load(func(k string) string {
			if k == "LOCKS_NATS_REPLICAS" {
				return tc.env
			}
			return ""
		}, nil, nil)
		switch {
		case tc.want == 0 && (!errors.Is(err, config.ErrUsage) || !strings.Contains(err.Error(), "LOCKS_NATS_REPLICAS")):
			t.Errorf("LOCKS_NATS_REPLICAS=%s: %v, want an error naming the variable", tc.env, err)
		case tc.want != 0 && (err != nil || c.NATSReplicas != tc.want):
			t.Errorf("LOCKS_NATS_REPLICAS=%s: %d, %v; want %d", tc.env, c.NATSReplicas, err, tc.want)
		}
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--nats-replicas=3"}); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(func(string) string { return "" }, fs, vals)
	if err != nil || c.NATSReplicas != 3 {
		t.Fatalf("--nats-replicas=3: %d, %v; want 3", c.NATSReplicas, err)
	}
}
