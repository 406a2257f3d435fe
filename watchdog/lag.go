package watchdog

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
