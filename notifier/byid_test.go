package notifier

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestSupersedeRowFinishedMeanwhile: a row whose failed attempt is being recorded (its
// finish holds the row) when an ingest supersedes it is superseded once the finish commits.
// The update reaches its rows by TID (byTID), and a TID scan skips a row updated after the
// statement's snapshot: supersede must take its snapshot after its locks.
func TestSupersedeRowFinishedMeanwhile(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Postgres(t)
	ctx := t.Context()
	var old int64
	if err := pool.QueryRow(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, attempts, lease_until, lease_token)
		VALUES ('evt_1', 'c1', 's1', 1, '{}', 1, now() + interval '1 minute', 7) RETURNING id`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload)
		VALUES ('evt_2', 'c1', 's1', 2, '{}')`); err != nil {
		t.Fatal(err)
	}
	// The finish of the old row's attempt: a retry, not committed yet.
	fin, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fin.Rollback(context.Background()) }()
	if _, err := fin.Exec(ctx, `UPDATE notifier_deliveries SET lease_until = NULL, lease_token = NULL, attempts = 2,
		next_at = now() + interval '1 hour' WHERE id = $1 AND sensor_id = 's1'`, old); err != nil {
		t.Fatal(err)
	}
	type out struct {
		recs []event.Attempt
		err  error
	}
	done := make(chan out, 1)
	go func() {
		var o out
		o.err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			var err error
			o.recs, err = supersede(context.Background(), tx, []string{"c1"}, []string{"s1"})
			return err
		})
		done <- o
	}()
	testenv.Eventually(t, 10*time.Second, "supersede waiting for the finish's row lock", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := fin.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM notifier_deliveries WHERE id = $1`, old).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != StateSuperseded || len(o.recs) != 1 || o.recs[0].EventID != "evt_1" {
		t.Fatalf("old row %s with records %+v, want superseded with one record", state, o.recs)
	}
}
