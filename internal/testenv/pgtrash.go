package testenv

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// trashPrefix names the test databases that a janitor drops.
const trashPrefix = "locks_trash_"

var janitor struct {
	once sync.Once
	wake chan struct{}
}

// discardDatabase takes a test's database out of use at once, renamed into the trash, for a
// janitor to drop in the background: a DROP DATABASE waits for a checkpoint of the whole
// server, seconds while other tests write, and the test need not wait for it. A database
// still in use after a few tries is dropped at once instead.
func discardDatabase(ctx context.Context, name string) {
	c, err := pgx.Connect(ctx, pgAdminURL())
	if err != nil {
		return
	}
	defer c.Close(ctx)
	rename := "ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " RENAME TO " + pgx.Identifier{trashPrefix + name}.Sanitize()
	for range 20 {
		// A session the test's processes left (a killed child's) would stop the rename.
		_, _ = c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
		if _, err := c.Exec(ctx, rename); err == nil {
			janitor.once.Do(func() {
				janitor.wake = make(chan struct{}, 1)
				go dropTrash()
			})
			select {
			case janitor.wake <- struct{}{}:
			default:
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// dropTrash drops the trash when woken: this binary's and what earlier ones left at their
// exit. Drops at once share the checkpoint each waits for.
func dropTrash() {
	ctx := context.Background()
	for range janitor.wake {
		names := pgDatabases(ctx, trashPrefix)
		var g errgroup.Group
		g.SetLimit(4)
		for _, n := range names {
			g.Go(func() error {
				c, err := pgx.Connect(ctx, pgAdminURL())
				if err != nil {
					return nil
				}
				defer c.Close(ctx)
				_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize())
				return nil
			})
		}
		_ = g.Wait()
	}
}

// pgDatabases lists the test Postgres's databases whose name starts with prefix, templates
// aside; none when it cannot.
func pgDatabases(ctx context.Context, prefix string) []string {
	c, err := pgx.Connect(ctx, pgAdminURL())
	if err != nil {
		return nil
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1) AND NOT datistemplate`, prefix)
	if err != nil {
		return nil
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return names
}
