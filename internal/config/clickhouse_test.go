package config_test

import (
	"errors"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestClickHouseCluster(t *testing.T) {
	t.Parallel()
	load := func(v string) (config.Config, error) {
		return config.Load(func(k string) string {
			if k == "LOCKS_CLICKHOUSE_CLUSTER" {
				return v
			}
			return ""
		}, nil, nil)
	}
	for _, v := range []string{"", "locks_cluster"} {
		c, err := load(v)
		if err != nil || c.ClickHouseCluster != v {
			t.Errorf("LOCKS_CLICKHOUSE_CLUSTER=%q: %q, %v", v, c.ClickHouseCluster, err)
		}
	}
	// The name goes into DDL unquoted: anything but an identifier is refused.
	for _, v := range []string{"a b", "x;DROP", "1st"} {
		_, err := load(v)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Var != "LOCKS_CLICKHOUSE_CLUSTER" {
			t.Errorf("LOCKS_CLICKHOUSE_CLUSTER=%q: error %v, want one naming the variable", v, err)
		}
	}
}
