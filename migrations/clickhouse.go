package migrations

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouse's migrations use goose's file format (NNNNN_name.sql with `-- +goose Up`/`Down`
// sections) but a runner of their own: goose creates its version table inside a database/sql
// transaction, which the native driver cannot do against ClickHouse 18.16 (it hangs and the
// connection closes). ClickHouse DDL is not transactional anyway; each statement here is
// written to be repeatable (IF NOT EXISTS), so a migration cut halfway is simply re-run.

const chVersionTable = "schema_migrations"

type chMigration struct {
	version int64
	name    string
	stmts   []string
}

func readClickHouseMigrations(fsys fs.FS) ([]chMigration, error) {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var ms []chMigration
	for _, f := range files {
		num, _, ok := strings.Cut(path.Base(f), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("clickhouse migration %s: name must start with a version number and _", f)
		}
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		up := string(b)
		if _, after, ok := strings.Cut(up, "-- +goose Up"); ok {
			up = after
		}
		up, _, _ = strings.Cut(up, "-- +goose Down")
		m := chMigration{version: v, name: f}
		// Comments first (they may hold semicolons), then one statement per semicolon.
		var code []string
		for _, l := range strings.Split(up, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				code = append(code, l)
			}
		}
		for _, st := range strings.Split(strings.Join(code, "\n"), ";") {
			if st = strings.TrimSpace(st); st != "" {
				m.stmts = append(m.stmts, st)
			}
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("clickhouse migrations %s and %s share version %d", ms[i-1].name, ms[i].name, ms[i].version)
		}
	}
	return ms, nil
}

func migrateClickHouse(ctx context.Context, conn driver.Conn, fsys fs.FS, log *slog.Logger) error {
	ms, err := readClickHouseMigrations(fsys)
	if err != nil {
		return err
	}
	if err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+chVersionTable+
		" (version Int64, name String, applied DateTime DEFAULT now()) ENGINE = ReplacingMergeTree() ORDER BY version"); err != nil {
		return fmt.Errorf("clickhouse migrations: create %s: %w", chVersionTable, err)
	}
	applied := map[int64]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM "+chVersionTable)
	if err != nil {
		return fmt.Errorf("clickhouse migrations: read %s: %w", chVersionTable, err)
	}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		applied[v] = true
	}
	rows.Close()
	var n int
	var last int64
	for _, m := range ms {
		last = m.version
		if applied[m.version] {
			continue
		}
		for _, st := range m.stmts {
			if err := conn.Exec(ctx, st); err != nil {
				return fmt.Errorf("clickhouse migration %s: %w", m.name, err)
			}
		}
		// Through the batch API: 18.16 does not answer an INSERT … VALUES with bound parameters.
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+chVersionTable+" (version, name)")
		if err == nil {
			if err = b.Append(m.version, m.name); err == nil {
				err = b.Send()
			}
		}
		if err != nil {
			return fmt.Errorf("clickhouse migration %s: record version: %w", m.name, err)
		}
		n++
	}
	log.Info("migrated", "database", "clickhouse", "applied", n, "version", last)
	return nil
}
