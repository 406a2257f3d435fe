package migrations_test

import (
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestAutovacuumThresholdsKeepHandTuning: migration 00190 gives every partition of the hot
// tables autovacuum thresholds of 5,000 rows, but a threshold set on a partition before it (by
// an operator) stays as it was. Down, the partitions have no thresholds.
func TestAutovacuumThresholdsKeepHandTuning(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u, pool := testenv.Postgres(t)
	p := postgresMigrations(t, u)
	if _, err := p.DownTo(ctx, 180); err != nil {
		t.Fatal(err)
	}
	opts := func(table string) string {
		t.Helper()
		var o string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE relname = $1`, table).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := opts("sensor_state_p00"); strings.Contains(o, "threshold") {
		t.Fatalf("before 00190: sensor_state_p00 has %s", o)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE notifier_deliveries_p07 SET (autovacuum_vacuum_threshold = 123)`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]string{
		"sensor_state_p00":        "fillfactor=70,autovacuum_vacuum_threshold=5000,autovacuum_analyze_threshold=5000",
		"sensor_state_p15":        "fillfactor=70,autovacuum_vacuum_threshold=5000,autovacuum_analyze_threshold=5000",
		"notifier_deliveries_p00": "autovacuum_vacuum_scale_factor=0.02,autovacuum_analyze_scale_factor=0.02,fillfactor=50,autovacuum_vacuum_threshold=5000,autovacuum_analyze_threshold=5000",
		"notifier_deliveries_p07": "autovacuum_vacuum_scale_factor=0.02,autovacuum_analyze_scale_factor=0.02,fillfactor=50,autovacuum_vacuum_threshold=123,autovacuum_analyze_threshold=5000",
	} {
		if got := opts(table); got != want {
			t.Errorf("%s: %s, want %s", table, got, want)
		}
	}
}
