package main

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpProbe is /readyz's RabbitMQ check: one connection kept open and asked whether it still
// is, redialled only once it has closed, so that polling readiness never churns RabbitMQ's
// connections (each one costs RabbitMQ a process and a log line).
type amqpProbe struct {
	url string

	mu   sync.Mutex
	conn *amqp.Connection
}

func newAMQPProbe(url string) *amqpProbe { return &amqpProbe{url: url} }

// Check reports whether the kept connection is open, dialling it if it is not.
func (p *amqpProbe) Check(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	c, err := amqp.DialConfig(p.url, amqp.Config{
		// No heartbeat means a dead peer is noticed only when TCP gives up; RabbitMQ's own
		// default of 60 s is kept.
		Heartbeat: 10 * time.Second,
		Dial: func(network, addr string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var d net.Dialer
			return d.DialContext(dctx, network, addr)
		},
		Properties: amqp.Table{"connection_name": "locks readiness"},
	})
	if err != nil {
		return err
	}
	p.conn = c
	return nil
}

// Close closes the kept connection.
func (p *amqpProbe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn = nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}
