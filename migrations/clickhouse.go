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

	"github.com/lock-sensors/lock-sensors/internal/chschema"
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

// clickHouseMigrations are the migrations of layout l. One node: the SQL files. A cluster
// starts at the current definition (internal/chschema), recorded as the latest version: the
// files' history (tables made and refilled by RENAME) is of single-node databases.
func clickHouseMigrations(l chschema.Layout) ([]chMigration, error) {
	if l.Cluster == "" {
		return readClickHouseMigrations(ClickHouse())
	}
	return []chMigration{{version: latestVersion(ClickHouse()), name: "cluster " + l.Cluster, stmts: chschema.Create(l)}}, nil
}

// versionTable is the DDL of the applied versions' table. A cluster's is replicated to
// every node under one ZooKeeper path (no {shard}), so a migrator on any node sees them.
func versionTable(l chschema.Layout) string {
	cols := " (version Int64, name String, applied DateTime DEFAULT now())"
	if l.Cluster == "" {
		return "CREATE TABLE IF NOT EXISTS " + chVersionTable + cols + " ENGINE = ReplacingMergeTree() ORDER BY version"
	}
	return "CREATE TABLE IF NOT EXISTS " + l.Database + "." + chVersionTable + " ON CLUSTER " + l.Cluster + cols +
		" ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/" + l.Database + "/" + chVersionTable + "', '{replica}') ORDER BY version"
}

// migrateClickHouse applies the migrations of l that conn's database lacks. With lockURL,
// they are applied under a Postgres advisory lock (lock.go), and the applied versions read
// again once it is held: another process may have applied them meanwhile.
func migrateClickHouse(ctx context.Context, conn driver.Conn, l chschema.Layout, lockURL string, log *slog.Logger) error {
	ms, err := clickHouseMigrations(l)
	if err != nil {
		return err
	}
	if err := conn.Exec(ctx, versionTable(l)); err != nil {
		return fmt.Errorf("clickhouse migrations: create %s: %w", chVersionTable, err)
	}
	last := ms[len(ms)-1].version
	pending, err := pendingClickHouse(ctx, conn, ms)
	if err != nil || len(pending) == 0 {
		if err == nil {
			log.Info("migrated", "database", "clickhouse", "applied", 0, "version", last)
		}
		return err
	}
	apply := func() error {
		if lockURL != "" {
			if pending, err = pendingClickHouse(ctx, conn, ms); err != nil {
				return err
			}
		}
		for _, m := range pending {
			if err := applyClickHouse(ctx, conn, m); err != nil {
				return err
			}
		}
		log.Info("migrated", "database", "clickhouse", "applied", len(pending), "version", last)
		return nil
	}
	if lockURL == "" {
		return apply()
	}
	return withPostgresLock(ctx, lockURL, "locks.migrate.clickhouse/"+l.Database, apply)
}

// pendingClickHouse are the migrations of ms that the version table does not list.
func pendingClickHouse(ctx context.Context, conn driver.Conn, ms []chMigration) ([]chMigration, error) {
	applied := map[int64]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM "+chVersionTable)
	if err != nil {
		return nil, fmt.Errorf("clickhouse migrations: read %s: %w", chVersionTable, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("clickhouse migrations: read %s: %w", chVersionTable, err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("clickhouse migrations: read %s: %w", chVersionTable, err)
	}
	var out []chMigration
	for _, m := range ms {
		if !applied[m.version] {
			out = append(out, m)
		}
	}
	return out, nil
}

// applyClickHouse runs m's statements and records its version.
func applyClickHouse(ctx context.Context, conn driver.Conn, m chMigration) error {
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
	return nil
}
