package notifier

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// Warm plans the notifier's hot statements on c, a new connection of the notifier's pool,
// before the notifier uses it: the intake's INSERT and lease, the claim's and finish's
// statements, each once on nothing, under the settings it runs with, in transactions
// rolled back. Their plans cover every partition of notifier_deliveries, and making them
// while deliveries wait is what held the first webhooks of a process back
// (docs/performance.md).
func Warm(ctx context.Context, c *pgx.Conn) error {
	intake := &pgx.Batch{}
	intake.Queue(pgtx.GenericPlans)
	queueInsert(intake, nil, nil, nil)
	queueLease(intake, []int64{}, []string{}, time.Second, 0)
	claim := &pgx.Batch{}
	queueCandidates(claim, capacity{}, 0)
	fin := &pgx.Batch{}
	queueFinish(fin, outcomeArgs{})
	for _, b := range []*pgx.Batch{intake, claim, fin} {
		if err := rolledBack(ctx, c, b); err != nil {
			return err
		}
	}
	return nil
}

// rolledBack sends b in a transaction on c and rolls it back.
func rolledBack(ctx context.Context, c *pgx.Conn, b *pgx.Batch) error {
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	return tx.SendBatch(ctx, b).Close()
}
