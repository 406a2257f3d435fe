package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// Planning a statement over a partitioned table opens every partition and its indexes, and a
// new connection has none of them cached: its first statements wait for that. Autovacuum
// touching a partition makes every connection plan its statements over the table again.

// prewarmTimeout bounds how long a start waits to open its first connections.
const prewarmTimeout = 10 * time.Second

// warmConnection returns a pool's AfterConnect: on each new connection, before any part uses
// it, a look-up over each of tables with a generic plan, which opens every partition and
// index of the table, then plans (nil: nothing more). A failure is logged and left: the
// connection works without it.
func warmConnection(tables []string, plans func(context.Context, *pgx.Conn) error, log *slog.Logger) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, c *pgx.Conn) error {
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, pgtx.GenericPlans); err != nil {
				return err
			}
			for _, t := range tables {
				if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{t}.Sanitize()+` WHERE sensor_id = $1`, ""); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && plans != nil {
			err = plans(ctx, c)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("could not warm a new Postgres connection; its first statements will be slower", "tables", tables, "err", err)
		}
		return nil
	}
}

// prewarm opens n of pool's connections at once (each warmed by its AfterConnect) and puts
// them back idle, so that the parts' first statements do not wait for them. A connection
// that cannot be opened now is opened when it is needed.
func prewarm(ctx context.Context, pool *pgxpool.Pool, n int, log *slog.Logger) {
	wctx, cancel := context.WithTimeout(ctx, prewarmTimeout)
	defer cancel()
	conns := make([]*pgxpool.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { conns[i], _ = pool.Acquire(wctx) })
	}
	wg.Wait()
	opened := 0
	for _, c := range conns {
		if c != nil {
			c.Release()
			opened++
		}
	}
	if opened < n && ctx.Err() == nil {
		log.Warn("could not open every Postgres connection ahead; the rest open as needed",
			"pool", pool.Config().ConnConfig.RuntimeParams["application_name"], "opened", opened, "wanted", n)
	}
}
