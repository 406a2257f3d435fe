package alerter

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockKey names the session-level advisory lock whose holder is the active alerter.
const lockKey = "locks.alerter"

// withLock runs fn while holding the alerter's advisory lock on a connection of its own
// (not the pool's, so that no other work shares the session, and closing it releases the
// lock whatever happened). It returns nil at once when another process holds the lock.
// ping tells fn whether the session, and so the lock, is still there.
func (a *Alerter) withLock(ctx context.Context, fn func(ctx context.Context, ping func(context.Context) error) error) error {
	conn, err := pgx.ConnectConfig(ctx, a.d.PG.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect for the alerter's lock: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, lockKey).Scan(&held); err != nil {
		return fmt.Errorf("take the alerter's lock: %w", err)
	}
	if !held {
		a.m.active.Set(0)
		return nil
	}
	// A stop does not cut a ping short: pgx closes a connection whose query is cancelled, and
	// that would give the lock up while a sender still finishes its notice.
	ping := func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.SendTimeout)
		defer cancel()
		return conn.Ping(pctx)
	}
	return fn(ctx, ping)
}
