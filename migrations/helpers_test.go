package migrations_test

import (
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

// The tests mostly wait on Postgres and ClickHouse, each on its own database.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

func mustGlob(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	m, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(m) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	return m
}

// postgresMigrations is goose over the Postgres migrations on the database at url, for a test
// that moves it to a given version; its connection is closed at the end of the test.
func postgresMigrations(t *testing.T, url string) *goose.Provider {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Postgres())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
