package notifier

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// Defaults of the janitor.
const (
	// RetentionDefault is Config.Retention: finished rows are kept a week.
	RetentionDefault = 7 * 24 * time.Hour
	// janitorEvery is how often rows a crashed process left behind are superseded.
	janitorEvery = 5 * time.Second
	// retentionEvery is how often rows past the retention are deleted.
	retentionEvery = time.Hour
)

// janitor supersedes rows left behind by crashed processes, and forgets finished rows after
// the retention (dead rows stay until redriven).
func (n *Notifier) janitor(ctx context.Context) {
	t := time.NewTicker(janitorEvery)
	defer t.Stop()
	last := time.Time{}
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		var recs []event.Attempt
		err := pgx.BeginFunc(ctx, n.db, func(tx pgx.Tx) error {
			var err error
			if recs, err = supersede(ctx, tx, nil, nil); err != nil {
				return err
			}
			return writeOutbox(ctx, tx, recs)
		})
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("supersede sweep", "err", err)
			}
			continue
		}
		n.count(recs)
		if len(recs) > 0 {
			n.relay.Wake()
		}
		if time.Since(last) > retentionEvery {
			last = time.Now()
			_, err := n.db.Exec(ctx, `DELETE FROM notifier_deliveries
				WHERE state IN ('delivered', 'cancelled', 'superseded') AND updated_at < now() - $1 * interval '1 microsecond'`,
				n.cfg.Retention.Microseconds())
			if err != nil && ctx.Err() == nil {
				n.log.Warn("delete finished deliveries past retention", "err", err)
			}
		}
	}
}
