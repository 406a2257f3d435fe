package migrations_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// migrators is how many processes start at once against one fresh database.
const migrators = 4

// all runs f migrators times at once and fails t with every error.
func all(t *testing.T, f func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, migrators)
	start := make(chan struct{})
	for range migrators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- f()
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// Processes that start together all migrate one fresh Postgres database without an error,
// and goose's version table lists each migration once.
func TestPostgresMigratesOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := testenv.Name("locks_conc")
	u := strings.Replace(testenv.PostgresAdminURL(), "/postgres?", "/"+name+"?", 1)
	t.Cleanup(func() { testenv.DropPostgresDatabase(name) })
	all(t, func() error { return migrations.MigratePostgres(ctx, u, testenv.Logger(t)) })

	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows, versions int
	if err := conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0").Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if want := len(mustGlob(t, migrations.Postgres())); rows != want || versions != want {
		t.Fatalf("goose_db_version: %d rows of %d versions, want each of %d once", rows, versions, want)
	}
}

// Likewise ClickHouse, serialised by the Postgres lock: schema_migrations lists each
// migration once, and the tables are those of one run.
func TestClickHouseMigratesOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := testenv.Name("locks_conc")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, name) })
	opts := migrations.ClickHouseOptions{LockPostgresURL: testenv.PostgresURL(t)}
	u := "clickhouse://" + testenv.ClickHouseAddr() + "/" + name
	all(t, func() error { return migrations.MigrateClickHouseWith(ctx, u, opts, testenv.Logger(t)) })

	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}, Auth: clickhouse.Auth{Database: name}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var rows, versions uint64
	if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(version) FROM schema_migrations").Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if want := uint64(len(mustGlob(t, migrations.ClickHouse()))); rows != want || versions != want {
		t.Fatalf("schema_migrations: %d rows of %d versions, want each of %d once", rows, versions, want)
	}
	var tables []string
	r, err := conn.Query(ctx, "SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var n string
		if err := r.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	r.Close()
	if got := strings.Join(tables, ","); got != "deliveries,events,history_positions,readings,schema_migrations" {
		t.Fatalf("tables after the migrations: %s", got)
	}
}
