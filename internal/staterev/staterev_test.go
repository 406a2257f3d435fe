package staterev

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Of reads each sensor's revision with a generic plan (pg_prepared_statements counts
// them), and the settings that ask for it end with its batch: the pooled connection it used plans the next statement as before.
func TestOfKeepsItsPlanSettingsToItself(t *testing.T) {
	pool := testenv.PostgresOneConn(t) // every call on the same connection
	now := time.Now()
	for i, id := range []string{"a", "b"} {
		if _, err := pool.Exec(t.Context(), `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			VALUES ($1, 0, 0, $2, $2, $2, $3, 'online', 1)`, id, now, int64(i+3)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		got, err := Of(t.Context(), pool, []string{"a", "b", "none"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got["a"] != 3 || got["b"] != 4 {
			t.Fatalf("revisions %v, want a:3 b:4 and nothing for none", got)
		}
		var mode, seqscan string
		if err := pool.QueryRow(t.Context(), `SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan')`).Scan(&mode, &seqscan); err != nil {
			t.Fatal(err)
		}
		if mode != "auto" || seqscan != "on" {
			t.Fatalf("after Of the connection has plan_cache_mode %s and enable_seqscan %s, want auto and on", mode, seqscan)
		}
	}
	var generic, custom int64
	if err := pool.QueryRow(t.Context(), `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE '%LATERAL (SELECT sensor_id, revision FROM sensor_state%'`).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic != 3 || custom != 0 {
		t.Errorf("the look-up ran with %d generic and %d custom plans, want 3 generic", generic, custom)
	}
}
