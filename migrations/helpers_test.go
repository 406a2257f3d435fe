package migrations_test

import (
	"io/fs"
	"testing"
)

func mustGlob(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	m, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(m) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	return m
}
