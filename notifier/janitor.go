package notifier

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// janitorEvery is how often rows a crashed process left behind are superseded.
const janitorEvery = 5 * time.Second

// janitor supersedes rows left behind by crashed processes, and forgets finished and dead
// rows after their retentions (retention.go).
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
		n.sweepRetention(ctx, &last)
	}
}
