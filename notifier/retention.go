package notifier

import (
	"context"
	"fmt"
	"time"
)

// Retention defaults (LOCKS_NOTIFIER_RETENTION, LOCKS_NOTIFIER_DEAD_RETENTION). Rows of
// pending deliveries are never deleted; the attempt history stays in ClickHouse.
const (
	// RetentionDefault is Config.Retention: finished rows are kept a week.
	RetentionDefault = 7 * 24 * time.Hour
	// DeadRetentionDefault is Config.DeadRetention: a dead letter waits 90 days for a redrive.
	DeadRetentionDefault = 90 * 24 * time.Hour
	// KeepUntilRedriven as Config.DeadRetention keeps dead rows until they are redriven.
	KeepUntilRedriven time.Duration = -1
	// retentionEvery is how often rows past the retention are deleted.
	retentionEvery = time.Hour
	// retentionBatch bounds one DELETE, so that a large backlog never holds locks for long.
	retentionBatch = 10_000
)

// deleteExpired deletes finished rows (delivered, cancelled, superseded) not updated for the
// retention, and dead rows not updated (died or redriven) for the dead retention, in batches.
func (n *Notifier) deleteExpired(ctx context.Context) (finished, dead int64, err error) {
	if finished, err = n.deleteRows(ctx, `state IN ('delivered', 'cancelled', 'superseded')`, n.cfg.Retention); err != nil {
		return finished, 0, fmt.Errorf("delete finished deliveries past retention: %w", err)
	}
	if n.cfg.DeadRetention < 0 { // KeepUntilRedriven
		return finished, 0, nil
	}
	if dead, err = n.deleteRows(ctx, `state = 'dead'`, n.cfg.DeadRetention); err != nil {
		return finished, dead, fmt.Errorf("delete dead deliveries past retention: %w", err)
	}
	return finished, dead, nil
}

func (n *Notifier) deleteRows(ctx context.Context, where string, age time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := n.db.Exec(ctx, `DELETE FROM notifier_deliveries WHERE (id, sensor_id) IN (
			SELECT id, sensor_id FROM notifier_deliveries
			WHERE `+where+` AND updated_at < now() - $1 * interval '1 microsecond' LIMIT $2)`,
			age.Microseconds(), retentionBatch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < retentionBatch {
			return total, nil
		}
	}
}

// sweepRetention runs deleteExpired at most every retentionEvery, the first time at once.
func (n *Notifier) sweepRetention(ctx context.Context, last *time.Time) {
	if !last.IsZero() && time.Since(*last) < retentionEvery {
		return
	}
	*last = time.Now()
	finished, dead, err := n.deleteExpired(ctx)
	if err != nil && ctx.Err() == nil {
		n.log.Warn("delivery retention", "err", err)
	}
	if finished+dead > 0 {
		n.log.Info("deleted delivery rows past their retention", "finished", finished, "dead", dead)
	}
}
