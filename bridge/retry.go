package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// retryPolicy spaces the retries of an append or a session record while NATS is away.
var retryPolicy = backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}

// recordSession writes the session's record, retrying while NATS is away (appends wait then
// too) until ctx ends.
func (b *Bridge) recordSession(ctx context.Context, sess *session, tag uint64, since time.Time) error {
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
		// A record whose connection is lost is written again at once: RabbitMQ's acks, and
		// with them every reading behind its window, wait for it.
		rctx, cancelLost := natsx.UntilLost(rctx, b.js.Conn())
		err := sess.record(rctx, tag, since)
		cancelLost()
		cancel()
		if err == nil {
			return nil
		}
		if !backoff.Sleep(ctx, retryPolicy.Next(attempt)) {
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		}
	}
}

// republish retries a failed append with the same Nats-Msg-Id until JetStream acks it or
// ctx ends. Later readings of the same sensor wait for it (see order), so a retry never
// lands after them; other sensors' readings go on.
func (b *Bridge) republish(ctx context.Context, msg *nats.Msg, first error) (*jetstream.PubAck, error) {
	err := first
	for attempt := 1; ; attempt++ {
		b.m.retries.Inc()
		// A NATS restart fails every append in flight at once: log one line per second.
		if now := time.Now(); now.Sub(b.lastRetryLog) >= time.Second || attempt%20 == 0 {
			b.lastRetryLog = now
			b.log.Warn("append to READINGS failed; retrying (further failures within 1s not logged)",
				"subject", msg.Subject, "attempt", attempt, "err", err)
		}
		pctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
		// Sent just before the connection was found dead, its ack would never come.
		pctx, cancelLost := natsx.UntilLost(pctx, b.js.Conn())
		var ack *jetstream.PubAck
		ack, err = b.js.PublishMsg(pctx, msg)
		cancelLost()
		cancel()
		if err == nil {
			return ack, nil
		}
		if !backoff.Sleep(ctx, retryPolicy.Next(attempt)) {
			return nil, fmt.Errorf("append to READINGS: %w (gave up: %w)", err, ctx.Err())
		}
	}
}
