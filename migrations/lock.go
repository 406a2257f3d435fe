package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// withPostgresLock runs fn holding the session-level advisory lock named key in the Postgres
// of dsn. ClickHouse has no lock of its own that a dead holder releases (a lock row needs a
// compare-and-set ClickHouse lacks, and a lease can run out under a slow migration), while a
// Postgres session lock ends with its connection. Every deployment has that Postgres.
func withPostgresLock(ctx context.Context, dsn, key string, fn func() error) error {
	cfg, err := postgresConfig(dsn)
	if err != nil {
		return err
	}
	if err := createPostgresDB(ctx, cfg); err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("migration lock: connect to Postgres at %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	// Closing the connection releases the lock, whatever happened meanwhile.
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key); err != nil {
		return fmt.Errorf("migration lock %q: %w", key, err)
	}
	return fn()
}
