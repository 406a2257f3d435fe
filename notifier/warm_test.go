package notifier

import (
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestWarmPlansTheHotStatements: after Warm, the connection holds the generic plans of the
// intake's lease, the claim's candidates and finish's update, which the notifier's first
// deliveries would otherwise wait for.
func TestWarmPlansTheHotStatements(t *testing.T) {
	t.Parallel()
	pool := testenv.PostgresOneConn(t)
	c, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if err := Warm(t.Context(), c.Conn()); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"lease":  "%lease_token = $4%",
		"claim":  "%WITH narrow AS MATERIALIZED%",
		"finish": "%attempts = d.attempts + CASE WHEN r.counted%",
	} {
		var plans int64
		if err := c.QueryRow(t.Context(), `SELECT coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
			WHERE statement LIKE $1`, text).Scan(&plans); err != nil {
			t.Fatal(err)
		}
		if plans != 1 {
			t.Errorf("%s: %d generic plans on the connection, want 1", name, plans)
		}
	}
}
