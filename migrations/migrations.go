// Package migrations holds the versioned Postgres and ClickHouse schemas, embedded in the
// binary and applied with goose: by `locks migrate` and at the start of `locks run`. Each
// creates its database when it is missing; applying them twice is a no-op.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
)

//go:embed postgres/*.sql
var postgresFS embed.FS

//go:embed clickhouse/*.sql
var clickhouseFS embed.FS

// Postgres returns the Postgres migrations (for tests that build template databases).
func Postgres() fs.FS { s, _ := fs.Sub(postgresFS, "postgres"); return s }

// ClickHouse returns the ClickHouse migrations.
func ClickHouse() fs.FS { s, _ := fs.Sub(clickhouseFS, "clickhouse"); return s }

// ConnectTimeout bounds each connection attempt of a migration.
const ConnectTimeout = 10 * time.Second

// postgresConfig parses dsn with each connection attempt bounded by ConnectTimeout.
func postgresConfig(dsn string) (*pgx.ConnConfig, error) {
	// Parsed as the process's pool parses it: the pool's own settings (pool_max_conns…)
	// are taken out, where pgx alone would send them to the server, which refuses them.
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_POSTGRES_URL: %w", err)
	}
	cfg := pcfg.ConnConfig
	// An unreachable server surfaces within seconds; the migrations themselves (a table moved
	// into partitions, another process's run waited for) may take long.
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > ConnectTimeout {
		cfg.ConnectTimeout = ConnectTimeout
	}
	return cfg, nil
}

// MigratePostgres creates the database of dsn if missing and applies every migration.
func MigratePostgres(ctx context.Context, dsn string, log *slog.Logger) error {
	cfg, err := postgresConfig(dsn)
	if err != nil {
		return err
	}
	if err := createPostgresDB(ctx, cfg); err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	return run(ctx, goose.DialectPostgres, db, Postgres(), "postgres", log)
}

func createPostgresDB(ctx context.Context, cfg *pgx.ConnConfig) error {
	name := cfg.Database
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to Postgres at %s:%d as %q: %w", cfg.Host, cfg.Port, cfg.User, err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %q: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	// Created meanwhile by another process: 42P04 when it had committed, or the catalog's
	// unique violation when both CREATE DATABASE ran at once.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505" && pgErr.ConstraintName == "pg_database_datname_index") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// ClickHouseDatabase is the database named by a clickhouse:// URL (default "locks").
func ClickHouseDatabase(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "locks"
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		return db
	}
	return "locks"
}

// ClickHouseOptions are how MigrateClickHouseWith applies the ClickHouse schema.
type ClickHouseOptions struct {
	// Cluster (LOCKS_CLICKHOUSE_CLUSTER) names the cluster whose nodes get replicated tables
	// and Distributed tables over them (internal/chschema); empty: one node, by the SQL files.
	Cluster string
	// LockPostgresURL is the Postgres whose advisory lock lets one process at a time migrate
	// (lock.go); empty only for a database nothing else migrates, such as a test's own.
	LockPostgresURL string
}

// MigrateClickHouse creates the single-node database of dsn if missing and applies every
// migration, taking no lock: for a database only the caller migrates.
func MigrateClickHouse(ctx context.Context, dsn string, log *slog.Logger) error {
	return MigrateClickHouseWith(ctx, dsn, ClickHouseOptions{}, log)
}

// MigrateClickHouseWith creates the database of dsn if missing and applies every migration
// in the layout opts names.
func MigrateClickHouseWith(ctx context.Context, dsn string, opts ClickHouseOptions, log *slog.Logger) error {
	copts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("LOCKS_CLICKHOUSE_URL: %w", err)
	}
	name := ClickHouseDatabase(dsn)
	if copts.DialTimeout == 0 || copts.DialTimeout > ConnectTimeout {
		copts.DialTimeout = ConnectTimeout
	}
	copts.ReadTimeout = time.Minute
	admin := *copts
	admin.Auth.Database = "default"
	adb := clickhouse.OpenDB(&admin)
	defer adb.Close()
	create := "CREATE DATABASE IF NOT EXISTS `" + name + "`"
	if opts.Cluster != "" {
		create += " ON CLUSTER " + opts.Cluster
	}
	if _, err := adb.ExecContext(ctx, create); err != nil {
		return fmt.Errorf("ClickHouse at %v: create database %q: %w", copts.Addr, name, err)
	}
	copts.Auth.Database = name
	conn, err := clickhouse.Open(copts)
	if err != nil {
		return fmt.Errorf("ClickHouse at %v: %w", copts.Addr, err)
	}
	defer conn.Close()
	return migrateClickHouse(ctx, conn, chschema.Layout{Cluster: opts.Cluster, Database: name}, opts.LockPostgresURL, log)
}

func run(ctx context.Context, dialect goose.Dialect, db *sql.DB, fsys fs.FS, what string, log *slog.Logger) error {
	// Every process migrates at start: goose's session lock (a Postgres advisory lock held by
	// one connection for the whole Up, freed if the process dies) lets one apply them while the
	// others wait, then find nothing left to do. Probed every second, bounded by ctx.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 3600))
	if err != nil {
		return fmt.Errorf("%s migrations: %w", what, err)
	}
	p, err := goose.NewProvider(dialect, db, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("%s migrations: %w", what, err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("%s migrations: %w", what, err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("%s migrations: %w", what, err)
	}
	log.Info("migrated", "database", what, "applied", len(res), "version", v)
	return nil
}

// latestVersion is the highest NNNNN_ prefix among fsys's migrations.
func latestVersion(fsys fs.FS) int64 {
	files, _ := fs.Glob(fsys, "*.sql")
	var max int64
	for _, f := range files {
		num, _, _ := strings.Cut(f, "_")
		if v, err := strconv.ParseInt(num, 10, 64); err == nil && v > max {
			max = v
		}
	}
	return max
}

// ErrNotMigrated says a database is reachable but behind the binary's schema.
var ErrNotMigrated = errors.New("database is not migrated; run `locks migrate`")

// PostgresReady reports whether Postgres answers and carries every migration of this binary.
func PostgresReady(ctx context.Context, pool *pgxpool.Pool) error {
	var v int64
	if err := pool.QueryRow(ctx, "SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied").Scan(&v); err != nil {
		return err
	}
	if want := latestVersion(Postgres()); v < want {
		return fmt.Errorf("%w (at version %d of %d)", ErrNotMigrated, v, want)
	}
	return nil
}

// ClickHouseReady reports whether ClickHouse answers and carries every migration of this binary.
func ClickHouseReady(ctx context.Context, conn driver.Conn) error {
	var v int64
	if err := conn.QueryRow(ctx, "SELECT toInt64(max(version)) FROM "+chVersionTable).Scan(&v); err != nil {
		return err
	}
	if want := latestVersion(ClickHouse()); v < want {
		return fmt.Errorf("%w (at version %d of %d)", ErrNotMigrated, v, want)
	}
	return nil
}
