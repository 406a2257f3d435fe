package watchdog

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
)

// CrashAfterRefresh is the crash point (internal/crashpoint) of a reading whose refresh is
// stored and that the consumer has neither acked nor written into the position.
const CrashAfterRefresh = "watchdog.after_refresh"

const (
	// ackEvery is how many messages may be acknowledged by one AckAll at most.
	ackEvery = 512
	// refreshRetry is the pause between synchronous retries of a refresh that failed.
	refreshRetry = 200 * time.Millisecond
	// refreshWarnEvery is how many failed retries of one refresh make a warning: a NATS
	// restart makes a few, more means the bucket is unusable.
	refreshWarnEvery = 25
)

// acker waits for each refresh in order, then acks (AckAll) the newest message whose refresh
// and every earlier one is stored, and records that progress in ps.
func (w *Watchdog) acker(ctx context.Context, in <-chan pending, ps *partState, done *atomic.Uint64) error {
	var last jetstream.Msg
	n := 0
	flush := func() {
		if last != nil {
			_ = last.Ack()
			last = nil
		}
	}
	for pd := range in {
		if pd.put != nil {
			if err := w.storeRefresh(ctx, pd); err != nil {
				return err
			}
			w.m.refreshes.Inc()
		}
		ps.doneTS.Store(pd.storedNS)
		ps.doneSeq.Store(pd.seq)
		done.Add(1)
		// Stored, and neither acked nor in the partition's position yet.
		crashpoint.Hit(CrashAfterRefresh)
		last = pd.msg
		n++
		if n%ackEvery == 0 || len(in) == 0 {
			flush()
		}
	}
	flush()
	return nil
}

// storeRefresh waits for pd's asynchronous refresh and, if it failed, publishes it again
// until it is stored: a reading is never acked before its key is written.
func (w *Watchdog) storeRefresh(ctx context.Context, pd pending) error {
	if pd.fut != nil {
		select {
		case <-pd.fut.Ok():
			return nil
		case <-pd.fut.Err():
		case <-pd.lost: // its ack went to the lost connection: published again below
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := backoff.New(refreshRetry, refreshRetry)
	for {
		_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: pd.put.Subject, Data: pd.put.Data, Header: nats.Header{}}, jetstream.WithMsgTTL(pd.ttl))
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		attempt := b.Fails() + 1
		level := slog.LevelDebug
		if attempt%refreshWarnEvery == 0 {
			level = slog.LevelWarn
		}
		w.log.Log(ctx, level, "refresh liveness key; retrying", "subject", pd.put.Subject, "attempt", attempt, "err", err)
		b.Wait(ctx)
	}
}
