package notifier

import (
	"context"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
)

// finishTries is how often a batch of outcomes is tried before its leases are left to expire.
const finishTries = 10

// finisher writes attempt outcomes in batches until results is closed.
func (n *Notifier) finisher() {
	batch := make([]result, 0, n.cfg.Batch)
	for r := range n.results {
		batch = append(batch[:0], r)
		// Wait a moment for more (one transaction per outcome would cost far more than the
		// wait), but only while results keep coming: a lone outcome is written at once.
		linger := time.NewTimer(2 * time.Millisecond)
	more:
		for len(batch) < 2*n.cfg.Batch {
			select {
			case r, ok := <-n.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
				continue
			default:
			}
			if len(batch) == 1 || n.inflight.Load() == 0 {
				break
			}
			select {
			case r, ok := <-n.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			case <-linger.C:
				break more
			}
		}
		linger.Stop()
		n.finishBatch(batch)
	}
}

// finishBatch writes one batch of outcomes. It runs on past the notifier's ctx: the outcomes
// of attempts made must be recorded while stopping.
func (n *Notifier) finishBatch(batch []result) {
	retry := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fd, err := finish(ctx, n.db, batch, n.cfg.DisableAfter, n.clock.Now())
		cancel()
		if err == nil {
			crashpoint.Hit(CrashAfterFinishCommit)
			now := time.Now()
			for _, r := range batch {
				if !r.aborted && r.state != StateCancelled {
					n.m.finish.Between(r.at.Add(r.latency), now)
				}
			}
			for client, why := range fd.disabled {
				n.log.Warn("webhook endpoint disabled: its deliveries wait until it is re-enabled", "client", client, "reason", why)
			}
			n.count(fd.recs)
			if fd.claimable {
				poke(n.wake)
			}
			n.relay.Wake()
			return
		}
		if retry.Fails()+1 >= finishTries {
			// The leases expire and the deliveries are attempted again: at least once.
			n.log.Error("cannot record attempt outcomes; they will be retried after their leases expire",
				"attempts", len(batch), "err", err)
			return
		}
		n.log.Warn("record attempt outcomes; retrying", "try", retry.Fails()+1, "err", err)
		retry.Wait(context.Background())
	}
}
