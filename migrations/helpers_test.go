package migrations_test

import (
	"io/fs"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
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
