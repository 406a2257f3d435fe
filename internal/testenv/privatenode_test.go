package testenv_test

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A committed row survives a SIGKILL of the private Postgres and its restart on the same data.
func TestPrivatePostgresKeepsCommittedRowsAcrossKill(t *testing.T) {
	t.Parallel()
	n := testenv.PrivatePostgres(t)
	ctx := t.Context()
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.WithoutCancel(ctx)) })
		return c
	}
	if _, err := connect().Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept SELECT generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	var got int
	if err := connect().QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != 1000 {
		t.Fatalf("after the kill: %d rows, want 1000", got)
	}
}

// An inserted block survives a SIGKILL of the private ClickHouse and its restart.
func TestPrivateClickHouseKeepsRowsAcrossKill(t *testing.T) {
	t.Parallel()
	n := testenv.PrivateClickHouse(t)
	ctx := t.Context()
	open := func() clickhouse.Conn {
		t.Helper()
		c, err := clickhouse.Open(&clickhouse.Options{Addr: []string{n.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	c := open()
	for _, q := range []string{"CREATE TABLE kept (v UInt64) ENGINE = MergeTree ORDER BY v", "INSERT INTO kept (v) SELECT number FROM system.numbers LIMIT 1000"} {
		if err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	n.Restart()
	var got uint64
	if err := open().QueryRow(ctx, "SELECT count() FROM kept").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != 1000 {
		t.Fatalf("after the kill: %d rows, want 1000", got)
	}
}
