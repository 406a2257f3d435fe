package migrations_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// A database made by the first schema (history partitioned by the sensor's ts) keeps every
// row when it is migrated to partitions by receive time, and a migration run again (cut before
// it was recorded) changes nothing.
func TestClickHouseHistoryByReceivedKeepsRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := testenv.Name("locks_test")
	admin, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, name) })
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}, Auth: clickhouse.Auth{Database: name}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The first migration by hand, as an older release left it, with rows.
	b, err := fs.ReadFile(migrations.ClickHouse(), "00001_history.sql")
	if err != nil {
		t.Fatal(err)
	}
	up, _, _ := strings.Cut(string(b), "-- +goose Down")
	var code []string
	for _, l := range strings.Split(up, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			code = append(code, l)
		}
	}
	for _, st := range strings.Split(strings.Join(code, "\n"), ";") {
		if st = strings.TrimSpace(st); st != "" {
			exec(t, conn, st)
		}
	}
	// Through the batch API: 18.16 does not answer an INSERT … VALUES over the native protocol.
	at := func(v string) time.Time { x, _ := time.Parse(time.DateTime, v); return x }
	batch(t, conn, "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)",
		[]any{"a", uint64(1), uint8(1), at("1970-01-02 00:00:00"), uint16(5), at("2026-11-22 10:00:00"), uint16(6), "m1"},
		[]any{"a", uint64(2), uint8(0), at("2090-01-01 00:00:00"), uint16(7), at("2026-11-22 10:00:01"), uint16(8), ""})
	batch(t, conn, "INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)",
		[]any{"evt_1", "a", "sensor.state_changed", uint64(1), uint8(1), (*uint8)(nil), at("1970-01-02 00:00:00"), uint16(5), uint64(1)})

	url := "clickhouse://" + testenv.ClickHouseAddr() + "/" + name
	check := func(when string) {
		t.Helper()
		for _, tc := range []struct{ table, key string }{
			{"readings", "toYYYYMM(received)"},
			{"events", "toYYYYMM(received)"},
		} {
			var key string
			if err := conn.QueryRow(ctx, "SELECT partition_key FROM system.tables WHERE database = currentDatabase() AND name = '"+tc.table+"'").Scan(&key); err != nil {
				t.Fatal(when, err)
			}
			if key != tc.key {
				t.Fatalf("%s: %s partitioned by %s, want %s", when, tc.table, key, tc.key)
			}
		}
		var got string
		if err := conn.QueryRow(ctx, `SELECT arrayStringConcat(groupArray(concat(toString(seq), toString(data), toString(time), toString(time_ms),
			toString(received), toString(received_ms), message_id)), '|') FROM (SELECT * FROM readings ORDER BY seq LIMIT 1 BY seq)`).Scan(&got); err != nil {
			t.Fatal(when, err)
		}
		if want := "111970-01-02 00:00:0052026-11-22 10:00:006m1|202090-01-01 00:00:0072026-11-22 10:00:018"; got != want {
			t.Fatalf("%s: readings %q, want %q", when, got, want)
		}
		if err := conn.QueryRow(ctx, `SELECT concat(event_id, toString(revision), toString(time), toString(received), toString(received_ms))
			FROM events LIMIT 1 BY event_id`).Scan(&got); err != nil {
			t.Fatal(when, err)
		}
		if want := "evt_111970-01-02 00:00:001970-01-02 00:00:005"; got != want {
			t.Fatalf("%s: events %q, want %q", when, got, want)
		}
		for _, gone := range []string{"readings_by_ts", "readings_by_received", "events_by_ts", "events_by_received"} {
			var n uint64
			if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = '"+gone+"'").Scan(&n); err != nil || n != 0 {
				t.Fatalf("%s: %s left behind (%d, %v)", when, gone, n, err)
			}
		}
	}
	if err := migrations.MigrateClickHouse(ctx, url, testenv.Logger(t)); err != nil {
		t.Fatal(err)
	}
	check("migrated")
	// Forget that it ran: every migration runs again over the migrated tables.
	exec(t, conn, "DROP TABLE schema_migrations")
	if err := migrations.MigrateClickHouse(ctx, url, testenv.Logger(t)); err != nil {
		t.Fatal(err)
	}
	check("migrated again")
}

func batch(t *testing.T, conn driver.Conn, insert string, rows ...[]any) {
	t.Helper()
	b, err := conn.PrepareBatch(t.Context(), insert)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := b.Append(r...); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func exec(t *testing.T, conn driver.Conn, q string) {
	t.Helper()
	if err := conn.Exec(context.WithoutCancel(t.Context()), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
