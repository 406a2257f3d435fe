package migrations_test

import (
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// A second migrate is a no-op, and readiness sees the schema as current.
func TestMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	log := testenv.Logger(t)

	pgURL, pool := testenv.Postgres(t)
	if err := migrations.MigratePostgres(ctx, pgURL, log); err != nil {
		t.Fatalf("second Postgres migrate: %v", err)
	}
	if err := migrations.PostgresReady(ctx, pool); err != nil {
		t.Fatalf("Postgres not ready after migrate: %v", err)
	}
	var applied int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM goose_db_version WHERE version_id > 0").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != len(mustGlob(t, migrations.Postgres())) {
		t.Fatalf("%d Postgres migrations recorded, want each once", applied)
	}

	chURL, conn := testenv.ClickHouse(t)
	if err := migrations.MigrateClickHouse(ctx, chURL, log); err != nil {
		t.Fatalf("second ClickHouse migrate: %v", err)
	}
	if err := migrations.ClickHouseReady(ctx, conn); err != nil {
		t.Fatalf("ClickHouse not ready after migrate: %v", err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM schema_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if int(n) != len(mustGlob(t, migrations.ClickHouse())) {
		t.Fatalf("%d ClickHouse migrations recorded, want each once", n)
	}
}

// A database created from scratch by MigratePostgres (not cloned from the test template), from
// a URL that also sizes the process's pool, as docs/configuration.md says it may.
func TestMigrateCreatesDatabase(t *testing.T) {
	t.Parallel()
	name := testenv.Name("locks_create")
	u := strings.Replace(testenv.PostgresAdminURL(), "/postgres?", "/"+name+"?pool_max_conns=5&", 1)
	t.Cleanup(func() { testenv.DropPostgresDatabase(name) })
	if err := migrations.MigratePostgres(t.Context(), u, testenv.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if err := migrations.MigratePostgres(t.Context(), u, testenv.Logger(t)); err != nil {
		t.Fatal(err)
	}
}
