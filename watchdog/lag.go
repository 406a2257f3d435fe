package watchdog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
)

// LagFunc tells whether the pipeline upstream of READINGS (the bridge and its RabbitMQ
// queue) is behind: readings exist that are not in the log yet. An error counts as behind.
type LagFunc func(ctx context.Context) (behind bool, err error)

// upstream tells whether held expiries must wait for the pipeline: while the Lag hook says
// behind (or fails), while our NATS connection is down or has just come back, and for the
// catch-up grace after any of these. Only the declare loop uses it, so it has no lock.
type upstream struct {
	lag   LagFunc
	nc    *nats.Conn
	grace time.Duration
	log   *slog.Logger

	lastBehind time.Time // when the upstream was last seen behind
	lagErr     bool      // whether the last ask of lag failed
	reconnects uint64    // nc's reconnect count when last looked
}

func newUpstream(lag LagFunc, nc *nats.Conn, grace time.Duration, log *slog.Logger) *upstream {
	return &upstream{lag: lag, nc: nc, grace: grace, log: log, reconnects: nc.Stats().Reconnects}
}

// behind is asked once per declare round.
func (u *upstream) behind(ctx context.Context) bool {
	behind, err := u.lag(ctx)
	now := time.Now()
	if err != nil {
		if !u.lagErr {
			u.log.Warn("upstream lag unknown; holding expiries", "err", err)
		}
		u.lagErr, behind = true, true
	} else if u.lagErr {
		u.lagErr = false
		u.log.Info("upstream lag known again")
	}
	// NATS itself was away: the bridge could not append either, and what it holds now
	// (unacked in RabbitMQ, so not counted as ready) is on its way in. Count it as behind.
	if u.nc.Status() != nats.CONNECTED {
		behind = true
	} else if r := u.nc.Stats().Reconnects; r != u.reconnects {
		u.reconnects = r
		u.log.Info("NATS reconnected; holding expiries for the catch-up grace", "grace", u.grace)
		behind = true
	}
	if behind {
		u.lastBehind = now
		return true
	}
	return !u.lastBehind.IsZero() && now.Sub(u.lastBehind) < u.grace
}

// RabbitLag is a LagFunc over the RabbitMQ queue the bridge drains: the upstream is behind
// when the queue has no consumer (the bridge is down) or more than maxReady messages ready
// (a backlog). It asks with a passive QueueDeclare, caching the answer for cacheFor; a
// missing queue or an unreachable server is an error, which the watchdog takes as behind.
func RabbitLag(url, queue string, maxReady int, cacheFor time.Duration) LagFunc {
	r := &rabbitLag{url: url, queue: queue, maxReady: maxReady, cacheFor: cacheFor}
	return r.behind
}

type rabbitLag struct {
	url, queue string
	maxReady   int
	cacheFor   time.Duration

	// mu guards the connection and the cached answer: a LagFunc may be shared.
	mu     sync.Mutex
	conn   *amqp.Connection
	at     time.Time
	last   bool
	lastOK bool
}

func (r *rabbitLag) behind(ctx context.Context) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastOK && time.Since(r.at) < r.cacheFor {
		return r.last, nil
	}
	r.lastOK = false
	if r.conn == nil || r.conn.IsClosed() {
		c, err := amqp.DialConfig(r.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return true, fmt.Errorf("RabbitMQ queue depth: %w", err)
		}
		r.conn = c
	}
	ch, err := r.conn.Channel()
	if err != nil {
		_ = r.conn.Close()
		return true, fmt.Errorf("RabbitMQ queue depth: %w", err)
	}
	// A failed passive declare closes the channel; Close on a closed one is harmless.
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	if err != nil {
		return true, fmt.Errorf("RabbitMQ queue %s: %w", r.queue, err)
	}
	r.last = q.Consumers == 0 || q.Messages > r.maxReady
	r.at, r.lastOK = time.Now(), true
	_ = ctx
	return r.last, nil
}
