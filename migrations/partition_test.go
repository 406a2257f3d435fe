package migrations_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// Migration 00070 moves the rows of sensor_state and notifier_deliveries into tables
// partitioned by hash(sensor_id), keeps the delivery ids' sequence, and the notifier's
// idempotent insert still finds its unique key.
func TestPartitionBySensorKeepsRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := testenv.Name("locks_part")
	u := strings.Replace(testenv.PostgresAdminURL(), "/postgres?", "/"+name+"?", 1)
	t.Cleanup(func() { testenv.DropPostgresDatabase(name) })
	admin, err := pgx.Connect(ctx, testenv.PostgresAdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	if _, err := postgresMigrations(t, u).UpTo(ctx, 65); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			SELECT 's' || g, g % 4, g % 2, now(), now(), now(), g, 'online', g FROM generate_series(1, 100) g`,
		`INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload)
			SELECT 'evt_' || g, 'c', 's' || g, 1, '\x00' FROM generate_series(1, 100) g`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close(ctx)
	if err := migrations.MigratePostgres(ctx, u, testenv.Logger(t)); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var states, stateParts, deliveries, deliveryParts, maxID, partitions int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM sensor_state), (SELECT count(DISTINCT tableoid) FROM sensor_state),
		(SELECT count(*) FROM notifier_deliveries), (SELECT count(DISTINCT tableoid) FROM notifier_deliveries), (SELECT max(id) FROM notifier_deliveries),
		(SELECT count(*) FROM pg_inherits WHERE inhparent IN ('sensor_state'::regclass, 'notifier_deliveries'::regclass))`).
		Scan(&states, &stateParts, &deliveries, &deliveryParts, &maxID, &partitions); err != nil {
		t.Fatal(err)
	}
	if states != 100 || deliveries != 100 || maxID != 100 || partitions != 32 || stateParts < 10 || deliveryParts < 10 {
		t.Fatalf("after 00070: %d states in %d partitions, %d deliveries (max id %d) in %d partitions, %d partitions in all",
			states, stateParts, deliveries, maxID, deliveryParts, partitions)
	}
	// The notifier's insert: a repeated event is skipped by the unique key, a new one takes the next id.
	var ids []int64
	rows, err := conn.Query(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload)
		VALUES ('evt_1', 'c', 's1', 1, '\x00'), ('evt_x', 'c', 's1', 2, '\x00')
		ON CONFLICT (event_id, client_id, sensor_id) DO NOTHING RETURNING id`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] <= 100 {
		t.Fatalf("insert after 00070 returned ids %v, want one id above 100", ids)
	}
}
